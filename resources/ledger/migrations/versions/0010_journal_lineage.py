"""step_run.journal_lineage: which paid replies a claim of the step may take back.

The journal of paid replies (docs/DESIGN.md#reply-journal) keeps every provider reply under
the lineage of the work that paid for it. A claim that goes on with the same work (a dead
owner's recovery, a retry after a failure) keeps the row's lineage and takes back what it
already paid for; a claim that starts new work (after a publish, a force, a redraw, a reply
the step refused) names a new one. Nullable column: existing rows get a lineage at their
next claim.

Revision ID: 0010_journal_lineage
Revises: 0009_run_lease
"""

import sqlalchemy as sa
from alembic import op

revision = "0010_journal_lineage"
down_revision = "0009_run_lease"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("step_run") as batch:
        batch.add_column(sa.Column("journal_lineage", sa.String(36), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_run") as batch:
        batch.drop_column("journal_lineage")
