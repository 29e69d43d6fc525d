"""run_lease: each run's coordinator proves it is alive (docs/DESIGN.md#run-leases).

The coordinator of a run renews its row every heartbeat and ends it when it finishes; the
resume sensor ends a run (in Dagster) whose row stopped being renewed, and never one whose
row is fresh, however long its steps wait for a worker.

Revision ID: 0009_run_lease
Revises: 0008_episode_calls
"""

import sqlalchemy as sa
from alembic import op

revision = "0009_run_lease"
down_revision = "0008_episode_calls"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_lease",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("started_at", sa.Text, nullable=False),
        sa.Column("heartbeat_at", sa.Text, nullable=False),
        sa.Column("ended_at", sa.Text),
        sa.Column("worker", sa.String(160), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_run_lease"),
    )


def downgrade() -> None:
    op.drop_table("run_lease")
