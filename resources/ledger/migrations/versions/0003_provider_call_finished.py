"""provider_call.finished_at: a call is recorded before it is sent, finished after.

A worker killed during a model call used to leave no trace of it (the server saw 32
requests, the ledger 28): the call was recorded only once its reply was back. Now the row
is written first and ``finished_at`` set with the reply; a row without it is a call whose
outcome is unknown (paid, most likely). Rows from before this revision are finished calls.

Revision ID: 0003_provider_call_finished
Revises: 0002_checkpoint_seal
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_provider_call_finished"
down_revision = "0002_checkpoint_seal"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("provider_call") as batch:
        batch.add_column(sa.Column("finished_at", sa.Text, nullable=True))
    # Every call recorded so far was recorded after its reply.
    op.execute("UPDATE provider_call SET finished_at = at WHERE finished_at IS NULL")


def downgrade() -> None:
    with op.batch_alter_table("provider_call") as batch:
        batch.drop_column("finished_at")
