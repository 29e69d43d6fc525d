"""episode_calls.estimated: the calls a story is estimated at when it is registered.

``storyboard add-episode`` records the estimate it prints; a ``[budget.exhausted]`` refusal
then suggests a cap that covers what the episode needs, not only twice the cap in force
(docs/DESIGN.md#spend-cap). Nullable column: episodes registered before have none.

Revision ID: 0011_episode_estimate
Revises: 0010_journal_lineage
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_episode_estimate"
down_revision = "0010_journal_lineage"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("episode_calls") as batch:
        batch.add_column(sa.Column("estimated", sa.Integer, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("episode_calls") as batch:
        batch.drop_column("estimated")
