"""CHECK constraints: a step status column holds one of the StepStatus values.

The judge reads ``step_run.status`` as a closed set (``pipeline_defs.resume.status``); the
database now refuses anything else instead of leaving a misspelt status for the judge to
retry forever. The audit's from/to status columns stay nullable (NULL passes a CHECK).
The values are written out here, not imported: a migration must not change when the code
does.

Revision ID: 0005_status_check
Revises: 0004_settings
"""

from alembic import op

revision = "0005_status_check"
down_revision = "0004_settings"
branch_labels = None
depends_on = None

_STATUSES = ("pending", "running", "completed", "partial", "failed", "stale", "not_applicable")


def _allowed(column: str) -> str:
    return f"{column} IN ({', '.join(repr(s) for s in _STATUSES)})"


# SQLite cannot add a constraint in place: batch mode copies the table (rows, indexes and
# the unique key) into one that has it. ``op.f``: the names are final (the models' naming
# convention would otherwise prefix them a second time).
def upgrade() -> None:
    with op.batch_alter_table("step_run") as batch:
        batch.create_check_constraint(op.f("ck_step_run_status"), _allowed("status"))
    with op.batch_alter_table("step_transition") as batch:
        batch.create_check_constraint(
            op.f("ck_step_transition_from_status"), _allowed("from_status")
        )
        batch.create_check_constraint(op.f("ck_step_transition_to_status"), _allowed("to_status"))


def downgrade() -> None:
    with op.batch_alter_table("step_transition") as batch:
        batch.drop_constraint(op.f("ck_step_transition_to_status"), type_="check")
        batch.drop_constraint(op.f("ck_step_transition_from_status"), type_="check")
    with op.batch_alter_table("step_run") as batch:
        batch.drop_constraint(op.f("ck_step_run_status"), type_="check")
