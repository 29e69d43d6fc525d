"""Checkpoints published under a step row's lock: the owner's publish, a mutator's edit of a
settled row, and the row's commit pointer (object storage) and checkpoint seal.

The pointer SQL itself lives in :mod:`resources.ledger.pointers`; here each use is one
transaction, retried whole after a dropped connection, with the side effect (a checkpoint
rename, an edit) run at most once (:class:`~resources.ledger.retry.Once`).
"""

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import SETTLED_RESULT, LedgerRow, StepStatus
from resources.ledger import pointers, statements
from resources.ledger.audit import Audit, write_audit
from resources.ledger.retry import Once
from resources.ledger.session import LedgerSession, now_text

T = TypeVar("T")


class Publishing:
    """Work under the row lock, commit pointers and seals."""

    def __init__(self, session: LedgerSession) -> None:
        self.session = session

    def publish(
        self,
        key: StepKey,
        run_id: str,
        fn: Callable[[], T],
        *,
        pointer: str | None = None,
        keep_archives: int = 5,
    ) -> T:
        """Run ``fn`` while holding the row lock of a row that still names this owner.

        After a dropped connection the lock is taken again; ``fn`` runs at most once (a
        retry after it ran only re-checks the owner and returns its result). ``pointer``
        (object storage): the manifest this publishes, stored in the same transaction.
        """
        once = Once(fn)
        ts = now_text()

        def body(_attempt: int) -> T:
            with self.session.write() as conn:
                owner = {**statements.key_params(key), "k_mine": run_id}
                locked = conn.execute(statements.lock_row(True), owner).first()
                if locked is None:
                    raise PipelineError(
                        ErrorCode.STEP_OWNERSHIP_LOST,
                        f"{key}: run {run_id} no longer owns the ledger row; refusing to publish",
                    )
                if pointer is not None:
                    pointers.replace_pointer(
                        conn,
                        key,
                        pointer,
                        reason="replaced",
                        run_id=run_id,
                        keep=keep_archives,
                        now=ts,
                    )
                return once()

        return self.session.retry("publish", body, callbacks=(once,))

    def swap_pointer(
        self,
        key: StepKey,
        *,
        expected: str,
        pointer: str,
        run_id: str | None,
        reason: str = "mutation",
        keep_archives: int = 5,
        now: str | None = None,
    ) -> bool:
        """Compare-and-set of a settled row's commit pointer (a mutator's edit of a victim
        on object storage): applied only while the row is not running and still publishes
        ``expected``; the replaced pointer is archived. A retry after a lost answer finds
        its own pointer in place and reports success."""
        ts = now or now_text()

        def body(attempt: int) -> bool:
            with self.session.write() as conn:
                if attempt > 1 and pointers.current_pointer(conn, key) == pointer:
                    return True
                return pointers.swap_pointer(
                    conn,
                    key,
                    expected=expected,
                    pointer=pointer,
                    reason=reason,
                    run_id=run_id,
                    keep=keep_archives,
                    now=ts,
                )

        return self.session.retry("swap a commit pointer", body)

    def adopt_pointer(self, key: StepKey, pointer: str, now: str | None = None) -> bool:
        """First pointer of a settled row that has none (``storyboard storage migrate``);
        False when the row is running, absent or already publishes one. Idempotent."""
        ts = now or now_text()

        def body(attempt: int) -> bool:
            with self.session.write() as conn:
                if attempt > 1 and pointers.current_pointer(conn, key) == pointer:
                    return True
                return pointers.adopt_pointer(conn, key, pointer, now=ts)

        return self.session.retry("adopt a commit pointer", body)

    def clear_seal(self, key: StepKey, seal: str, now: str | None = None) -> bool:
        """Drop ``seal`` from ``key``'s row while it still carries it (a scrub found the
        storage drifted from it); False when the row holds another seal by now."""
        ts = now or now_text()

        def body(attempt: int) -> bool:
            with self.session.write() as conn:
                return pointers.clear_seal(conn, key, seal, now=ts)

        return self.session.retry("clear a seal", body)

    def seal_unchanged(
        self, key: StepKey, seal: str, *, seen: LedgerRow, audit: Audit | None = None
    ) -> bool:
        """Seal a completed row that carries no seal, compare-and-set on ``seen`` (the row
        as it was read before its checkpoint was verified): False, and nothing written,
        when the row is running, sealed or changed since. ``audit``: its history line, in
        the same transaction. A retry after a lost answer finds its own seal in place."""
        ts = now_text()

        def body(attempt: int) -> bool:
            with self.session.write() as conn:
                if attempt > 1 and self.session.row_is(conn, key, checkpoint_seal=seal):
                    return True
                done = pointers.seal_unchanged(
                    conn,
                    key,
                    seal,
                    run_id=seen.run_id,
                    updated_at=seen.updated_at,
                    pointer=seen.checkpoint_pointer,
                )
                if done and audit is not None:
                    write_audit(conn, key, audit, ts, attempt=attempt)
                return done

        return self.session.retry("seal a row", body)

    def clear_episode_seals(self, project_id: str, episode_id: str) -> int:
        """Drop every seal of one episode's rows (its inputs were replaced)."""
        ts = now_text()

        def body(attempt: int) -> int:
            with self.session.write() as conn:
                return pointers.clear_episode_seals(conn, project_id, episode_id, now=ts)

        return self.session.retry("clear an episode's seals", body)

    def archived_pointers(self, key: StepKey) -> list[str]:
        """The step's replaced commit pointers, newest first."""
        return self.session.in_read(
            "read archived pointers", lambda conn: pointers.archived_pointers(conn, key)
        )

    def references(self) -> pointers.References:
        """Every commit pointer (current and archived) and every claim: what object-storage
        garbage collection must keep."""
        return self.session.in_read("read references", pointers.referenced)

    def with_settled_row(
        self,
        key: StepKey,
        fn: Callable[[], T],
        *,
        check: Callable[[], None] | None = None,
        reseal: bool = False,
        seal: str | None = None,
        pointer: str | None = None,
        reason: str = "mutation",
        run_id: str | None = None,
        keep_archives: int = 5,
        audit: Audit | None = None,
        refused: Audit | None = None,
    ) -> T:
        """Run ``fn`` under the row lock of a settled (completed/partial) row: one unit of
        work holding the edit, its seal, its pointer and its history line.

        Used by mutators to edit another step's checkpoint: refused while that step is
        running (its owner would publish over the edit) or has no completed result, and
        when ``check`` (the edit's compare-and-set, run under the lock before anything is
        written) raises a ``PipelineError``. A refusal writes ``refused`` (its reason
        extended by why) in the transaction that found it out, commits it and raises.

        Otherwise, in one transaction: with ``reseal`` the row's checkpoint seal becomes
        ``seal`` (a partial row never keeps one); ``audit`` is written; ``fn`` runs (the
        rename of the edited checkpoint); ``pointer`` (object storage): the edited
        checkpoint's manifest, stored with the pointer it replaces archived with ``reason``.
        The history line goes in before ``fn``: a line the database refuses leaves the
        checkpoint as it was. Both lines carry the row's status as their from and to
        status (an edit changes no status).

        Run again after a dropped connection, ``fn`` runs at most once, ``check`` is not
        asked again once ``fn`` ran (the victim then holds the edit), and each history line
        is recognised by its fixed timestamp: one line per edit, however many attempts.
        """
        once = Once(fn)
        ts = now_text()

        def body(attempt: int) -> T:
            refusal: PipelineError | None = None
            with self.session.write() as conn:
                landed = attempt > 1 and pointer is not None
                if landed and pointers.current_pointer(conn, key) == pointer:
                    return once()  # the commit landed: ``fn`` ran, its result is kept
                row = conn.execute(statements.lock_status(key)).first()
                status = None if row is None else str(row.status)
                if status is None or status not in SETTLED_RESULT:
                    refusal = _not_settled(key, status)
                elif check is not None and not once.done:
                    try:
                        check()
                    except PipelineError as exc:
                        refusal = exc
                if refusal is None:
                    if reseal:
                        completed = status == StepStatus.COMPLETED
                        conn.execute(statements.set_seal(key, seal if completed else None))
                    if audit is not None:
                        write_audit(conn, key, _with_status(audit, status), ts, attempt=attempt)
                    result = once()
                    if pointer is not None:
                        pointers.replace_pointer(
                            conn,
                            key,
                            pointer,
                            reason=reason,
                            run_id=run_id,
                            keep=keep_archives,
                            now=ts,
                        )
                    return result
                if refused is not None:
                    line = _with_status(refused, status)
                    why = refusal.message
                    line = replace(line, reason=f"{line.reason}: {why}" if line.reason else why)
                    write_audit(conn, key, line, ts, attempt=attempt)
            raise refusal  # once the refusal's line is committed

        return self.session.retry("edit a settled row", body, callbacks=(once,))


def _not_settled(key: StepKey, status: str | None) -> PipelineError:
    """Why a row that is running, absent or without a completed result takes no edit."""
    code = (
        ErrorCode.STEP_VICTIM_RUNNING
        if status == StepStatus.RUNNING
        else ErrorCode.STEP_VICTIM_NOT_SETTLED
    )
    return PipelineError(
        code,
        f"{key}: cannot edit its checkpoint while its ledger row is {status or 'absent'}",
        status=409,
    )


def _with_status(audit: Audit, status: str | None) -> Audit:
    """``audit`` as a line of a row that stays at ``status`` (absent: none)."""
    return replace(audit, from_status=status, to_status=status)
