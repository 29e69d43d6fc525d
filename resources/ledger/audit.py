"""Audit rows (``step_transition``) written in the transaction of the change they record.

A status change and its audit row commit together or not at all (docs/DESIGN.md#audit):
``transition_seq`` then follows commit order for each row, a crash can never leave a
status without its history or a history line without its status, and a transition the
store refuses (the owner lost the row, a claim that lost the race) is recorded as what it
was, a refusal, in the transaction that found it out.
"""

from dataclasses import dataclass, replace

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from pipeline_defs.resume.partition import StepKey
from resources.ledger.tables import step_transition

AUDIT_COLUMNS = (
    "project_id",
    "episode_id",
    "step_id",
    "from_status",
    "to_status",
    "action",
    "origin",
    "reason",
    "run_id",
    "launch_path",
    "at",
)
AUDIT_STATEMENT = (
    sa.insert(step_transition)
    .values({column: sa.bindparam(f"a_{column}") for column in AUDIT_COLUMNS})
    .returning(step_transition.c.transition_seq)
)


@dataclass(frozen=True)
class Audit:
    """One line of a step's history: what was done, from which status to which, and why."""

    action: str
    from_status: str | None
    to_status: str | None
    origin: str | None = None
    reason: str | None = None
    run_id: str | None = None
    launch_path: str | None = None

    def refused(self, action: str, reason: str) -> "Audit":
        """The same attempt, recorded as refused: the status stays what it was."""
        return replace(self, action=action, to_status=self.from_status, reason=reason)

    def values(self, key: StepKey, at: str) -> dict[str, str | None]:
        return {
            "project_id": key.project_id,
            "episode_id": key.episode_id,
            "step_id": key.step_id,
            "from_status": self.from_status,
            "to_status": self.to_status,
            "action": self.action,
            "origin": self.origin,
            "reason": self.reason,
            "run_id": self.run_id,
            "launch_path": self.launch_path,
            "at": at,
        }


def write_audit(conn: Connection, key: StepKey, audit: Audit, at: str, *, attempt: int) -> int:
    """Insert ``audit`` on ``conn`` (inside the caller's transaction); its ``transition_seq``.

    Run again after a lost answer (``attempt > 1``), a row with the same key, action, run,
    reason and microsecond timestamp is ours: found, not written twice.
    """
    values = audit.values(key, at)
    if attempt > 1:
        same = [
            step_transition.c[k].is_not_distinct_from(sa.literal(v, sa.Text))
            for k, v in values.items()
        ]
        found = conn.execute(sa.select(step_transition.c.transition_seq).where(*same)).first()
        if found is not None:
            return int(found[0])
    params = {f"a_{k}": v for k, v in values.items()}
    return int(conn.execute(AUDIT_STATEMENT, params).scalar_one())
