"""episode_calls: each episode's count of provider calls, the spend cap's counter.

A provider call is reserved by a conditional UPDATE of its episode's row (``calls < cap``)
in the transaction that records it (docs/DESIGN.md#spend-cap): the row lock makes two
steps of one episode take its last call one after the other, never both. Filled here from
the calls already recorded.

Revision ID: 0008_episode_calls
Revises: 0007_transition_worker
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_episode_calls"
down_revision = "0007_transition_worker"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "episode_calls",
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("episode_id", sa.String(64), nullable=False),
        sa.Column("calls", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("project_id", "episode_id", name="pk_episode_calls"),
    )
    op.execute(
        "INSERT INTO episode_calls (project_id, episode_id, calls) "
        "SELECT project_id, episode_id, COUNT(*) FROM provider_call "
        "GROUP BY project_id, episode_id"
    )


def downgrade() -> None:
    op.drop_table("episode_calls")
