"""Claims (docs/DESIGN.md#claims): one atomic upsert takes a step's row for a run, unless
another owner is running it; and the inserts of a row settled without a run (an adopted
orphan checkpoint, a step that does not apply).
"""

import enum
import functools
import uuid
from typing import Any, Final, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from resources.ledger.audit import Audit, worker, write_audit
from resources.ledger.session import B as _B
from resources.ledger.session import LedgerSession, key_params, now_text
from resources.ledger.tables import step_run
from resources.ledger.transitions import status_guard


class _NotJudged(enum.Enum):
    NOT_JUDGED = "not judged"


# ``claim(seen=...)`` default: no compare-and-set (operators and benchmarks claim blind).
NOT_JUDGED: Final = _NotJudged.NOT_JUDGED


# Prebuilt once per shape (see "prebuilt statements" in resources.ledger.session).
@functools.cache
def _claim_statement(on_sqlite: bool, seen: str, steal: bool, auto: bool, beat: bool) -> Any:
    """The claim upsert of docs/DESIGN.md#claims for one shape.

    ``seen``: "any" (no compare-and-set), "none" (the judge saw no row: only the insert may
    win) or "row" (the row must still have the run_id / updated_at the judge read);
    ``steal``: a stale running row may be taken over if started_at and run_id are still the
    texts the judge read; ``auto``: an automatic recovery (counted, reason recorded);
    ``beat``: the steal also needs heartbeat_at to be the text the judge read (an owner
    that renewed its lease since is alive).
    """
    insert = (sqlite.insert if on_sqlite else postgresql.insert)(step_run).values(
        id=_B("c_id"),
        project_id=_B("k_project"),
        episode_id=_B("k_episode"),
        step_id=_B("k_step"),
        status=StepStatus.RUNNING.value,
        run_id=_B("c_run_id"),
        started_at=_B("c_ts"),
        created_at=_B("c_ts"),
        updated_at=_B("c_ts"),
        heartbeat_at=_B("c_ts"),
        lock_owner=_B("c_owner"),
        recovery_count=1 if auto else 0,
        last_recovery_reason=_B("c_reason") if auto else None,
    )
    may_take: sa.ColumnElement[bool] = status_guard("claim")  # docs/DESIGN.md#status-transitions
    if seen == "none":
        may_take = sa.false()
    elif seen == "row":
        may_take = sa.and_(
            may_take,
            step_run.c.run_id.is_not_distinct_from(_B("c_seen_run_id", type_=sa.String)),
            step_run.c.updated_at == _B("c_seen_updated_at", type_=sa.Text),
        )
    if steal:  # a NULL started_at is never stealable: the caller only asks with both texts
        may_take = sa.or_(
            may_take,
            sa.and_(
                status_guard("steal"),
                step_run.c.started_at == _B("c_expected_started_at", type_=sa.Text),
                step_run.c.run_id == _B("c_expected_run_id", type_=sa.String),
                step_run.c.heartbeat_at == _B("c_expected_heartbeat_at", type_=sa.Text)
                if beat
                else sa.true(),
            ),
        )
    update: dict[str, Any] = {
        "run_id": _B("c_run_id"),
        "status": StepStatus.RUNNING.value,
        "started_at": _B("c_ts"),
        "updated_at": _B("c_ts"),
        "heartbeat_at": _B("c_ts"),
        "lock_owner": _B("c_owner"),
        "completed_at": None,
        "error_message": None,
        "checkpoint_seal": None,
        "recovery_count": step_run.c.recovery_count + (1 if auto else 0),
    }
    if auto:
        update["last_recovery_reason"] = _B("c_reason")
    return insert.on_conflict_do_update(
        index_elements=[step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id],
        set_=update,
        where=may_take,
    ).returning(step_run.c.run_id)


class Claims:
    """Claims of a step's row, and the rows settled without a run."""

    def __init__(self, session: LedgerSession) -> None:
        self.session = session

    def _insert(self) -> Any:
        return (sqlite.insert if self.session.is_sqlite else postgresql.insert)(step_run)

    def claim(
        self,
        key: StepKey,
        run_id: str,
        *,
        allow_stale_steal: bool = False,
        expected_started_at: str | None = None,
        expected_run_id: str | None = None,
        expected_heartbeat_at: str | None = None,
        auto_recovery: bool = False,
        reason: str | None = None,
        now: str | None = None,
        seen: LedgerRow | Literal[_NotJudged.NOT_JUDGED] | None = NOT_JUDGED,
        audit: Audit | None = None,
        refused: Audit | None = None,
    ) -> bool:
        """One atomic upsert: take the row unless another owner is running it.

        ``audit`` / ``refused``: the history line of a won / lost claim, written in the
        same transaction as the upsert (docs/DESIGN.md#audit).

        A running row is only taken over (``allow_stale_steal``) when its started_at and
        run_id (and, when given, heartbeat_at) are still exactly the texts the judge read.
        With ``seen`` (the row the judge
        read, or None for "no row") the claim is also a compare-and-set on that state: a
        run that judged a row which another run has since claimed, finished or failed
        wins nothing, so a step never executes twice for one judgement.
        Success = a row came back.
        """
        ts = now or now_text()
        seen_row = None if seen is NOT_JUDGED else seen
        shape = "any" if seen is NOT_JUDGED else "none" if seen_row is None else "row"
        steal = (
            allow_stale_steal and expected_started_at is not None and expected_run_id is not None
        )
        params: dict[str, Any] = {
            **key_params(key),
            "c_id": str(uuid.uuid4()),
            "c_run_id": run_id,
            "c_ts": ts,
            "c_owner": worker(),
        }
        if auto_recovery:
            params["c_reason"] = reason
        if seen_row is not None:
            params["c_seen_run_id"] = seen_row.run_id
            params["c_seen_updated_at"] = seen_row.updated_at
        beat = steal and expected_heartbeat_at is not None
        if steal:
            params["c_expected_started_at"] = expected_started_at
            params["c_expected_run_id"] = expected_run_id
        if beat:
            params["c_expected_heartbeat_at"] = expected_heartbeat_at
        statement = _claim_statement(self.session.is_sqlite, shape, steal, auto_recovery, beat)

        audited = audit is not None or refused is not None

        def body(attempt: int) -> bool:
            with self.session.write() if audited else self.session.single() as conn:
                # A retry after a dropped connection: the first attempt may have committed
                # (its answer lost). The row then names this run_id (unique per claim) and
                # this claim's started_at: that is our win, not another owner's row.
                if attempt > 1 and self.session.row_is(
                    conn, key, run_id=run_id, status=StepStatus.RUNNING, started_at=ts
                ):
                    return True
                found = conn.execute(statement, params).first()
                won = found is not None and found[0] == run_id
                line = audit if won else refused
                if line is not None:
                    write_audit(conn, key, line, ts, attempt=attempt)
            return won

        return self.session.retry("claim", body)

    def _settled_insert(
        self, key: StepKey, run_id: str, status: StepStatus, summary: str, ts: str
    ) -> Any:
        """INSERT of a finished row (adoption, not-applicable) with every NOT NULL column."""
        return self._insert().values(
            id=str(uuid.uuid4()),
            project_id=key.project_id,
            episode_id=key.episode_id,
            step_id=key.step_id,
            status=status.value,
            run_id=run_id,
            result_summary=summary,
            completed_at=ts,
            created_at=ts,
            updated_at=ts,
            recovery_count=0,
        )

    def adopt(
        self,
        key: StepKey,
        run_id: str,
        *,
        summary: str,
        seal: str | None = None,
        pointer: str | None = None,
        now: str | None = None,
        audit: Audit | None = None,
    ) -> bool:
        """Record a verified orphan checkpoint as completed; never overwrites an existing row.

        ``seal``: the adopting run verified it clean, so the row can carry its seal;
        ``pointer``: on object storage, the manifest of the attempt adopted;
        ``audit``: its history line, in the same transaction.
        """
        ts = now or now_text()
        statement = self._settled_insert(key, run_id, StepStatus.COMPLETED, summary, ts)
        statement = (
            statement.values(checkpoint_seal=seal, checkpoint_pointer=pointer)
            .on_conflict_do_nothing(
                index_elements=[step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id]
            )
            .returning(step_run.c.id)
        )

        def body(attempt: int) -> bool:
            with self.session.write() if audit is not None else self.session.single() as conn:
                # After a lost answer, our own insert is the row with our run and timestamp.
                if attempt > 1 and self.session.row_is(
                    conn, key, run_id=run_id, status=StepStatus.COMPLETED, created_at=ts
                ):
                    return True
                done = conn.execute(statement).first() is not None
                if done and audit is not None:
                    write_audit(conn, key, audit, ts, attempt=attempt)
                return done

        return self.session.retry("adopt", body)

    def mark_not_applicable(
        self,
        key: StepKey,
        run_id: str,
        reason: str,
        now: str | None = None,
        *,
        audit: Audit | None = None,
    ) -> bool:
        """Record that the step does not apply here; never touches a running row.
        ``audit``: its history line, in the same transaction."""
        ts = now or now_text()
        statement = (
            self._settled_insert(key, run_id, StepStatus.NOT_APPLICABLE, reason, ts)
            .on_conflict_do_update(
                index_elements=[step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id],
                set_={
                    "status": StepStatus.NOT_APPLICABLE.value,
                    "run_id": run_id,
                    "result_summary": reason,
                    "completed_at": ts,
                    "updated_at": ts,
                    "error_message": None,
                },
                where=status_guard("mark_not_applicable"),
            )
            .returning(step_run.c.id)
        )

        # Run again after a lost answer, the upsert finds our not-applicable row (not
        # running) and writes the same values: the same answer.
        def body(attempt: int) -> bool:
            with self.session.write() if audit is not None else self.session.single() as conn:
                done = conn.execute(statement).first() is not None
                if done and audit is not None:
                    write_audit(conn, key, audit, ts, attempt=attempt)
                return done

        return self.session.retry("mark not applicable", body)
