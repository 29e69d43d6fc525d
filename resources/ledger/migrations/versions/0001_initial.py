"""Create the ledger: step_run, step_transition, provider_call.

Revision ID: 0001_initial
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "step_run",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("episode_id", sa.String(64), nullable=False),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(128)),
        sa.Column("resolved_model", sa.Text),
        sa.Column("input_hash", sa.String(64)),
        sa.Column("upstream_revision", sa.Text),
        sa.Column("prompt_version", sa.Text),
        sa.Column("applicable_count", sa.Integer),
        sa.Column("completed_count", sa.Integer),
        sa.Column("failed_count", sa.Integer),
        sa.Column("error_message", sa.Text),
        sa.Column("result_summary", sa.Text),
        sa.Column("started_at", sa.Text),
        sa.Column("completed_at", sa.Text),
        sa.Column("created_at", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.Column("recovery_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("last_recovery_reason", sa.Text),
        sa.Column("retry_not_before", sa.Text),
        sa.Column("lock_owner", sa.Text),
        sa.Column("heartbeat_at", sa.Text),
        sa.PrimaryKeyConstraint("id", name="pk_step_run"),
        sa.UniqueConstraint(
            "project_id", "episode_id", "step_id", name="uq_step_run_project_id_episode_id_step_id"
        ),
    )
    op.create_index("ix_step_run_status", "step_run", ["status"])
    op.create_index("ix_step_run_updated_at", "step_run", ["updated_at"])
    op.create_table(
        "step_transition",
        sa.Column(
            "transition_seq",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("episode_id", sa.String(64), nullable=False),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("from_status", sa.String(16)),
        sa.Column("to_status", sa.String(16)),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("origin", sa.String(32)),
        sa.Column("reason", sa.Text),
        sa.Column("run_id", sa.String(128)),
        sa.Column("launch_path", sa.String(16)),
        sa.Column("at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("transition_seq", name="pk_step_transition"),
    )
    op.create_index(
        "ix_step_transition_key", "step_transition", ["project_id", "episode_id", "step_id"]
    )
    op.create_table(
        "provider_call",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer, "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("episode_id", sa.String(64), nullable=False),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(128)),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("units", sa.Integer, nullable=False),
        sa.Column("model", sa.Text),
        sa.Column("at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_provider_call"),
    )
    op.create_index(
        "ix_provider_call_key", "provider_call", ["project_id", "episode_id", "step_id"]
    )


def downgrade() -> None:
    op.drop_index("ix_provider_call_key", table_name="provider_call")
    op.drop_table("provider_call")
    op.drop_index("ix_step_transition_key", table_name="step_transition")
    op.drop_table("step_transition")
    op.drop_index("ix_step_run_updated_at", table_name="step_run")
    op.drop_index("ix_step_run_status", table_name="step_run")
    op.drop_table("step_run")
