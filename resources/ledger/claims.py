"""Claims (docs/DESIGN.md#claims): one atomic upsert takes a step's row for a run, unless
another owner is running it; and the inserts of a row settled without a run (an adopted
orphan checkpoint, a step that does not apply).
"""

import enum
import uuid
from typing import Any, Final, Literal

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from resources.ledger import claim_statements
from resources.ledger.audit import Audit, worker, write_audit
from resources.ledger.session import LedgerSession, now_text
from resources.ledger.statements import key_params


class _NotJudged(enum.Enum):
    NOT_JUDGED = "not judged"


# ``claim(seen=...)`` default: no compare-and-set (operators and benchmarks claim blind).
NOT_JUDGED: Final = _NotJudged.NOT_JUDGED
# What a claim saw: the row the judge read, None for "no row", or NOT_JUDGED.
Seen = LedgerRow | Literal[_NotJudged.NOT_JUDGED] | None


class Claims:
    """Claims of a step's row, and the rows settled without a run."""

    def __init__(self, session: LedgerSession) -> None:
        self.session = session

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
        fresh: bool = False,
        reason: str | None = None,
        now: str | None = None,
        seen: Seen = NOT_JUDGED,
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
        ``fresh``: the claim starts new work whatever the row's state (a force, a redraw):
        it takes a new journal lineage, so no reply paid for earlier is taken back.
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
            "c_fresh": fresh,
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
        statement = claim_statements.claim(
            self.session.is_sqlite, shape, steal, auto_recovery, beat
        )

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

    def journal_lineage(self, key: StepKey, run_id: str) -> str | None:
        """The journal lineage of ``key``'s row while claim ``run_id`` holds it (None: the
        claim no longer holds the row)."""

        def body(attempt: int) -> str | None:
            with self.session.single() as conn:
                value = conn.execute(claim_statements.journal_lineage(key, run_id)).scalar()
            return None if value is None else str(value)

        return self.session.retry("journal_lineage", body)

    def journal_lineages(self) -> dict[StepKey, tuple[str, str | None]]:
        """Every row's (status, journal lineage), by key."""

        def body(attempt: int) -> dict[StepKey, tuple[str, str | None]]:
            with self.session.single() as conn:
                rows = conn.execute(claim_statements.journal_lineages()).all()
            return {StepKey(p, e, s): (str(status), lineage) for p, e, s, status, lineage in rows}

        return self.session.retry("journal_lineages", body)

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
        statement = claim_statements.adopt(
            self.session.is_sqlite, key, run_id, summary=summary, seal=seal, pointer=pointer, ts=ts
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
        statement = claim_statements.mark_not_applicable(
            self.session.is_sqlite, key, run_id, reason, ts
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
