"""Who wrote each history line: ``step_transition.worker`` (``host:pid``).

A claim's line names the worker process that made it, so an operator can tell which machine
ran a step when several share one ledger. Nullable: lines written before stay NULL.

Revision ID: 0007_transition_worker
Revises: 0006_checkpoint_pointer
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_transition_worker"
down_revision = "0006_checkpoint_pointer"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("step_transition") as batch:
        batch.add_column(sa.Column("worker", sa.String(160), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_transition") as batch:
        batch.drop_column("worker")
