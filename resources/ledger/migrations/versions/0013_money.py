"""Budgets in money: usage, price and cost per provider call, spend per episode and day.

``provider_call`` gets the usage its endpoint reported (input, output and cached input
tokens), the price applied, the worst case reserved before it was sent and the cost
settled after (micro-units); ``episode_calls.cost_micros`` and the new
``project_day_spend`` are the money budgets' counters, reserved by a conditional UPDATE in
the transaction that records the call (docs/DESIGN.md#money-budgets). Calls recorded before
have no price: they spent nothing in money.

Revision ID: 0013_money
Revises: 0012_rate_limit
"""

import sqlalchemy as sa
from alembic import op

revision = "0013_money"
down_revision = "0012_rate_limit"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("provider_call") as batch:
        batch.add_column(sa.Column("input_tokens", sa.Integer, nullable=True))
        batch.add_column(sa.Column("output_tokens", sa.Integer, nullable=True))
        batch.add_column(sa.Column("cached_input_tokens", sa.Integer, nullable=True))
        batch.add_column(sa.Column("price", sa.Text, nullable=True))
        batch.add_column(
            sa.Column("reserved_micros", sa.BigInteger, nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("cost_micros", sa.BigInteger, nullable=True))
    with op.batch_alter_table("episode_calls") as batch:
        batch.add_column(
            sa.Column("cost_micros", sa.BigInteger, nullable=False, server_default="0")
        )
    op.create_table(
        "project_day_spend",
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("cost_micros", sa.BigInteger, nullable=False),
        sa.Column("calls", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("priced", sa.BigInteger, nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("project_id", "day", name="pk_project_day_spend"),
    )
    # The calls recorded before, counted per project and day (none had a price).
    op.execute(
        "INSERT INTO project_day_spend (project_id, day, cost_micros, calls, priced) "
        "SELECT project_id, substr(at, 1, 10), 0, count(*), 0 FROM provider_call "
        "GROUP BY project_id, substr(at, 1, 10)"
    )


def downgrade() -> None:
    op.drop_table("project_day_spend")
    with op.batch_alter_table("episode_calls") as batch:
        batch.drop_column("cost_micros")
    with op.batch_alter_table("provider_call") as batch:
        for column in (
            "cost_micros",
            "reserved_micros",
            "price",
            "cached_input_tokens",
            "output_tokens",
            "input_tokens",
        ):
            batch.drop_column(column)
