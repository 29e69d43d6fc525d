"""rate_limit and rate_wait: one rate limit per endpoint and model, shared by every process.

``rate_limit`` holds each endpoint and model's GCRA state (the next request's and tokens'
theoretical arrival times, an endpoint's ``Retry-After`` pause); ``rate_wait`` the steps
waiting for it now, for ``storyboard status`` (docs/DESIGN.md#rate-limit).

Revision ID: 0012_rate_limit
Revises: 0011_episode_estimate
"""

import sqlalchemy as sa
from alembic import op

revision = "0012_rate_limit"
down_revision = "0011_episode_estimate"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rate_limit",
        sa.Column("endpoint", sa.String(512), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("request_at", sa.Double, nullable=False),
        sa.Column("token_at", sa.Double, nullable=False),
        sa.Column("paused_until", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("endpoint", "model", name="pk_rate_limit"),
    )
    op.create_table(
        "rate_wait",
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("episode_id", sa.String(64), nullable=False),
        sa.Column("step_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(128)),
        sa.Column("endpoint", sa.String(512), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("until", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("project_id", "episode_id", "step_id", name="pk_rate_wait"),
    )


def downgrade() -> None:
    op.drop_table("rate_wait")
    op.drop_table("rate_limit")
