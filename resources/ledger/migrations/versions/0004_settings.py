"""settings and setting_change: the judge's limits kept in the ledger.

The sensor daemon and every run worker used to build their limits (lease, running timeout,
retries) from their own environment, so two processes could judge the same row with
different limits. The table is the one shared source; ``setting_change`` audits every
change. Values are seeded by ``storyboard migrate`` from its environment, never here: a
migration run by any worker must not turn that worker's per-process override into the
shared value.

Revision ID: 0004_settings
Revises: 0003_provider_call_finished
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_settings"
down_revision = "0003_provider_call_finished"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "settings",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.Column("updated_by", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_settings"),
    )
    op.create_table(
        "setting_change",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("old_value", sa.Text),
        sa.Column("new_value", sa.Text, nullable=False),
        sa.Column("changed_at", sa.Text, nullable=False),
        sa.Column("changed_by", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_setting_change"),
    )


def downgrade() -> None:
    op.drop_table("setting_change")
    op.drop_table("settings")
