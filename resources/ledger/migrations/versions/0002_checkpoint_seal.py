"""step_run.checkpoint_seal: the file identities a run verified when it published.

Revision ID: 0002_checkpoint_seal
Revises: 0001_initial
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_checkpoint_seal"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: existing rows simply have no seal (their checkpoints are verified
    # by reading them, as before). ADD COLUMN of a nullable column rewrites no table.
    with op.batch_alter_table("step_run") as batch:
        batch.add_column(sa.Column("checkpoint_seal", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_run") as batch:
        batch.drop_column("checkpoint_seal")
