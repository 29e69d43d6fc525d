"""Writes of a step row's status: the owner's transition (docs/DESIGN.md#owner-aware), with
its checkpoint published under the row lock; the owner's lease and recovery bookkeeping; an
explicit force's invalidation and the operator's reset of a stuck row.
"""

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import TERMINAL_STATUSES, StepStatus
from resources.ledger import pointers, statements
from resources.ledger.audit import Audit, write_audit
from resources.ledger.retry import Once
from resources.ledger.session import LedgerSession, now_text
from resources.ledger.statements import key_params

_STATUS_TEXTS = tuple(s.value for s in StepStatus)


class StatusWrites:
    """Owner-aware status writes, and the few that are guarded by the status instead."""

    def __init__(self, session: LedgerSession) -> None:
        self.session = session

    def transition(
        self,
        key: StepKey,
        run_id: str,
        status: StepStatus | str,
        *,
        require_owner: bool = True,
        applicable_count: int | None = None,
        completed_count: int | None = None,
        failed_count: int | None = None,
        error: str | None = None,
        summary: str | None = None,
        resolved_model: str | None = None,
        input_hash: str | None = None,
        publish: Callable[[], Any] | None = None,
        seal: str | None = None,
        pointer: str | None = None,
        keep_archives: int = 5,
        now: str | None = None,
        audit: Audit | None = None,
        refused: Audit | None = None,
    ) -> bool:
        """Move the row to ``status`` if this run still owns it.

        ``audit``: the history line of the change, committed with it; ``refused``: the line
        recorded instead when the row no longer names this owner (docs/DESIGN.md#audit).

        ``pointer`` (object storage): the manifest of the checkpoint this transition
        publishes, stored on the locked row in the same transaction as the status; the
        pointer it replaces goes to ``checkpoint_archive`` (newest ``keep_archives`` kept).
        A worker that lost the row publishes nothing: its objects stay in its own attempt.

        ``seal`` (resources.checkpoints.seal) describes the clean checkpoint this transition
        publishes or keeps; every transition writes it, so any other status clears it.

        With ``publish`` the owner's row is locked first, the status written, ``publish``
        run (the checkpoint rename) and everything committed together, so a worker whose
        lease was stolen can neither record a status nor replace the newer checkpoint.
        Returns False (and runs nothing) when the row no longer names this owner.
        """
        if status not in _STATUS_TEXTS:  # the CHECK constraint would refuse it mid-transaction
            raise PipelineError(
                ErrorCode.INPUT_INVALID,
                f"{key}: {status!r} is not a step status (one of {', '.join(_STATUS_TEXTS)})",
            )
        status = StepStatus(status)
        ts = now or now_text()
        values: dict[str, Any] = {
            "status": status.value,
            "updated_at": ts,
            "error_message": error,
            "checkpoint_seal": seal,
        }
        for column, value in (
            ("applicable_count", applicable_count),
            ("completed_count", completed_count),
            ("failed_count", failed_count),
            ("result_summary", summary),
            ("resolved_model", resolved_model),
            ("input_hash", input_hash),
        ):
            if value is not None:
                values[column] = value
        if status in TERMINAL_STATUSES:
            values["completed_at"] = ts
        params: dict[str, Any] = {**key_params(key), "k_mine": run_id}
        params.update({f"v_{column}": value for column, value in values.items()})
        statement = statements.transition(tuple(sorted(values)), require_owner)
        # Retried after a dropped connection, the unit writes the same values (``ts``
        # included) where the row still names this owner: a commit that did land is
        # simply confirmed. ``publish`` (the checkpoint rename) runs at most once: a retry
        # after it ran re-takes the row lock, re-checks the owner and commits. A rename
        # cannot be taken back; a session lost while it ran leaves the window that a lost
        # commit always left (another run could only take the row after our lease lapsed).
        once = Once(publish) if publish is not None else None

        def body(attempt: int) -> bool:
            with self.session.write() as conn:
                if once is not None or pointer is not None:
                    locked = conn.execute(statements.lock_row(require_owner), params).first()
                    if locked is None:
                        if refused is not None:
                            write_audit(conn, key, refused, ts, attempt=attempt)
                        return False
                previous = pointers.current_pointer(conn, key) if pointer is not None else None
                changed = conn.execute(statement, params).rowcount
                if changed != 1:
                    if refused is not None:
                        write_audit(conn, key, refused, ts, attempt=attempt)
                    return False
                if audit is not None:
                    write_audit(conn, key, audit, ts, attempt=attempt)
                if pointer is not None:  # a retry finds its own pointer: nothing archived
                    pointers.set_pointer(
                        conn,
                        key,
                        pointer,
                        previous=previous,
                        reason="replaced",
                        run_id=run_id,
                        keep=keep_archives,
                        now=ts,
                    )
                if once is not None:
                    once()
            return True

        return self.session.retry("transition", body, callbacks=(once,) if once else ())

    # The three owner-aware updates below write fixed values (timestamps taken once, before
    # the first attempt): run twice, they match the same row and leave it the same.
    def reset_recovery(self, key: StepKey, run_id: str) -> bool:
        statement = statements.set_owned(
            key,
            run_id,
            recovery_count=0,
            last_recovery_reason=None,
            retry_not_before=None,
            updated_at=now_text(),
        )
        return self.session.in_single(
            "reset recovery", lambda c: c.execute(statement).rowcount == 1
        )

    def set_retry_not_before(self, key: StepKey, run_id: str, when: str) -> bool:
        statement = statements.set_owned(key, run_id, retry_not_before=when, updated_at=now_text())
        return self.session.in_single(
            "set retry_not_before", lambda c: c.execute(statement).rowcount == 1
        )

    def heartbeat(self, key: StepKey, run_id: str, now: str | None = None) -> bool:
        """Renew the owner's lease; False when the row no longer names ``run_id``."""
        statement = statements.set_owned(key, run_id, heartbeat_at=now or now_text())
        return self.session.in_single("heartbeat", lambda c: c.execute(statement).rowcount == 1)

    def invalidate(
        self,
        keys: Iterable[StepKey],
        reason: str,
        now: str | None = None,
        *,
        audit: Audit | None = None,
    ) -> list[StepKey]:
        """Mark rows stale (explicit force only). Running rows are left to their owner.

        ``audit``: the history line of each row staled, written in the same transaction
        with the status it had as ``from_status`` and ``stale`` as ``to_status``.
        """
        ts = now or now_text()
        wanted = list(keys)  # a retry walks them again
        stale = StepStatus.STALE.value

        # Run again after a lost commit, a row already stale with this call's timestamp and
        # reason is ours: counted, not written (or audited) a second time.
        def body(attempt: int) -> list[StepKey]:
            done: list[StepKey] = []
            with self.session.write() as conn:
                for key in wanted:
                    row = conn.execute(
                        statements.lock_status(key, "updated_at", "result_summary")
                    ).first()
                    if row is None:
                        continue
                    if attempt > 1 and tuple(row) == (stale, ts, reason):
                        done.append(key)
                        continue
                    result = conn.execute(statements.invalidate(key, reason=reason, ts=ts))
                    if result.rowcount != 1:
                        continue
                    done.append(key)
                    if audit is not None:
                        line = replace(audit, from_status=str(row.status), to_status=stale)
                        write_audit(conn, key, line, ts, attempt=attempt)
                    # On object storage the checkpoint leaves service with its row (the local
                    # store moves the file to archive/): its pointer is archived.
                    pointers.replace_pointer(
                        conn, key, None, reason="force", run_id=None, keep=5, now=ts
                    )
            return done

        return self.session.retry("invalidate", body)

    def reset_running(self, key: StepKey, expected_started_at: str | None, reason: str) -> bool:
        """Operator reset of a stuck row to failed; refuses unless it is unchanged."""
        ts = now_text()
        statement = statements.reset_running(
            key, expected_started_at=expected_started_at, reason=reason, ts=ts
        )

        def body(attempt: int) -> bool:
            with self.session.single() as conn:
                if conn.execute(statement).rowcount == 1:
                    return True
                # After a lost answer the row is no longer running: ours if it is the reset
                # this call wrote (same reason, same timestamp).
                return attempt > 1 and self.session.row_is(
                    conn,
                    key,
                    status=StepStatus.FAILED,
                    error_message=reason,
                    updated_at=ts,
                    completed_at=ts,
                )

        return self.session.retry("reset running", body)
