"""Commit pointers for checkpoints on object storage.

``step_run.checkpoint_pointer``: the manifest of the published checkpoint (NULL on a local
directory); ``checkpoint_archive``: the pointers it replaced. Nullable column, new table:
existing rows and local homes are untouched.

Revision ID: 0006_checkpoint_pointer
Revises: 0005_status_check
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_checkpoint_pointer"
down_revision = "0005_status_check"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("step_run") as batch:
        batch.add_column(sa.Column("checkpoint_pointer", sa.Text, nullable=True))
    op.create_table(
        "checkpoint_archive",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("episode_id", sa.String(64), nullable=False),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("pointer", sa.Text, nullable=False),
        sa.Column("reason", sa.String(32), nullable=False),
        sa.Column("run_id", sa.String(128)),
        sa.Column("archived_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoint_archive"),
    )
    op.create_index(
        "ix_checkpoint_archive_key",
        "checkpoint_archive",
        ["project_id", "episode_id", "step_id"],
    )


def downgrade() -> None:
    op.drop_index("ix_checkpoint_archive_key", table_name="checkpoint_archive")
    op.drop_table("checkpoint_archive")
    with op.batch_alter_table("step_run") as batch:
        batch.drop_column("checkpoint_pointer")
