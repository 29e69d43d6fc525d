"""Audit rows (``step_transition``) written in the transaction of the change they record.

A status change and its audit row commit together or not at all (docs/DESIGN.md#audit):
``transition_seq`` then follows commit order for each row, a crash can never leave a
status without its history or a history line without its status, and a transition the
store refuses (the owner lost the row, a claim that lost the race) is recorded as what it
was, a refusal, in the transaction that found it out.
"""

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from sqlalchemy.engine import Connection

from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from resources.ledger import history_statements


class AuditAction(StrEnum):
    """``step_transition.action``: what a history line records (stored and compared as text).

    The judge's verdicts carry the ``ResumeAction`` values (``skip``, ``rerun_self``, ...;
    ``claim_rejected`` is a claim that lost); the rest are the follow-up transitions of a
    run, an edit or an operator command. Readers (``status``, ``history``) compare the text.
    """

    # A judge's verdict, recorded by the run that judged it.
    SKIP = "skip"
    ADOPT = "adopt"
    BLOCK = "block"
    NOT_APPLICABLE = "not_applicable"
    RERUN_SELF = "rerun_self"
    FORCE_EXPLICIT = "force_explicit"
    REDRAW_EXPLICIT = "redraw_explicit"
    STALE_RUNNING_RECOVERY = "stale_running_recovery"
    CLAIM_REJECTED = "claim_rejected"
    # What the claiming run did next.
    FINISH = "finish"
    FAILED = "failed"
    OWNERSHIP_LOST = "ownership_lost"
    INVALIDATE = "invalidate"  # a downstream row staled by an explicit force
    MUTATED = "mutated"  # a mutator's edit of a victim, settled (or rolled back)
    EDIT_REFUSED = "edit_refused"  # an edit of a victim refused: running, unsettled, changed
    ACCEPTED = "accepted"  # ``storyboard accept``: a hand edit adopted
    RESET_RUNNING = "reset_running"  # ``storyboard reset-running``: a dead owner's row released
    SEALED = "sealed"  # ``storyboard seal``: an unsealed completed row verified clean, sealed


# The lines that record a judge's verdict: every ``ResumeAction``, a SKIP that adopted an
# orphan checkpoint, and a claim that lost (the rest are follow-up transitions).
VERDICT_ACTIONS: frozenset[str] = frozenset(
    {*(a.value for a in ResumeAction), AuditAction.ADOPT.value, AuditAction.CLAIM_REJECTED.value}
)
_ACTIONS: dict[str, AuditAction] = {a.value: a for a in AuditAction}


@dataclass(frozen=True)
class Transition:
    """One ``step_transition`` row as read back (``LedgerStore.transitions``).

    ``action`` is the :class:`AuditAction` it names; text that names none (a caller of
    ``append_transition`` recording its own word) stays text. The statuses are the
    ledger's (its CHECK constraints allow only :class:`StepStatus` values, or none).
    """

    transition_seq: int
    project_id: str
    episode_id: str
    step_id: str
    from_status: StepStatus | None
    to_status: StepStatus | None
    action: AuditAction | str
    origin: str | None
    reason: str | None
    run_id: str | None
    launch_path: str | None
    at: str
    worker: str | None = None  # host:pid of the process that wrote it (NULL: before 0007)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "Transition":
        """Build from a ``step_transition`` database row."""
        action = str(row["action"])
        return cls(
            transition_seq=int(row["transition_seq"]),
            project_id=str(row["project_id"]),
            episode_id=str(row["episode_id"]),
            step_id=str(row["step_id"]),
            from_status=_status(row["from_status"]),
            to_status=_status(row["to_status"]),
            action=_ACTIONS.get(action, action),
            origin=row["origin"],
            reason=row["reason"],
            run_id=row["run_id"],
            launch_path=row["launch_path"],
            at=str(row["at"]),
            worker=row.get("worker"),
        )

    @property
    def key(self) -> StepKey:
        return StepKey(self.project_id, self.episode_id, self.step_id)


# The ``storyboard worker`` this process serves, and that worker's own pid (None: no
# worker). Set once in the worker's process before its Celery pool forks, so each pool
# child inherits it.
_started_as: tuple[str, int] | None = None


def serve_as(name: str) -> None:
    """Name this process (a ``storyboard worker``, its Celery node name
    ``storyboard-<pid>@<host>``) and, through it, the pool children it forks from now on."""
    global _started_as
    _started_as = (name, os.getpid())


def worker() -> str:
    """This process, as the ledger names it (a claim's ``lock_owner``, and the ``worker`` of
    every history line it writes): ``host:pid``; in a ``storyboard worker`` the name it was
    started under, as Dagster's event log and Celery name it, then the pool child that does
    the work: ``storyboard-18111@vm, child vm:19199`` (``storyboard-18111@vm`` for the
    worker's own process)."""
    here = f"{socket.gethostname()}:{os.getpid()}"
    if _started_as is None:
        return here
    name, pid = _started_as
    return name if pid == os.getpid() else f"{name}, child {here}"


def _status(value: str | None) -> StepStatus | None:
    return None if value is None else StepStatus(value)


@dataclass(frozen=True)
class Audit:
    """One line of a step's history: what was done, from which status to which, and why.

    ``action`` is an :class:`AuditAction`; plain text is accepted from callers that still
    pass it (``LedgerStore.append_transition``) and is stored the same way.
    """

    action: AuditAction | str
    from_status: str | None
    to_status: str | None
    origin: str | None = None
    reason: str | None = None
    run_id: str | None = None
    launch_path: str | None = None

    def refused(self, action: AuditAction | str, reason: str) -> "Audit":
        """The same attempt, recorded as refused: the status stays what it was."""
        return replace(self, action=action, to_status=self.from_status, reason=reason)

    def values(self, key: StepKey, at: str) -> dict[str, str | None]:
        return {
            "project_id": key.project_id,
            "episode_id": key.episode_id,
            "step_id": key.step_id,
            "from_status": self.from_status,
            "to_status": self.to_status,
            "action": str(self.action),  # the text, never the member (drivers bind text)
            "origin": self.origin,
            "reason": self.reason,
            "run_id": self.run_id,
            "launch_path": self.launch_path,
            "at": at,
            "worker": worker(),
        }


def write_audit(conn: Connection, key: StepKey, audit: Audit, at: str, *, attempt: int) -> int:
    """Insert ``audit`` on ``conn`` (inside the caller's transaction); its ``transition_seq``.

    Run again after a lost answer (``attempt > 1``), a row with the same key, action, run,
    reason and microsecond timestamp is ours: found, not written twice.
    """
    values = audit.values(key, at)
    if attempt > 1:
        found = conn.execute(history_statements.history_line(values)).first()
        if found is not None:
            return int(found[0])
    params = {f"a_{k}": v for k, v in values.items()}
    return int(conn.execute(history_statements.APPEND_HISTORY, params).scalar_one())
