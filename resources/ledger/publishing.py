"""Checkpoints published under a step row's lock: the owner's publish, a mutator's edit of a
settled row, and the row's commit pointer (object storage) and checkpoint seal.

The pointer SQL itself lives in :mod:`resources.ledger.pointers`; here each use is one
transaction, retried whole after a dropped connection, with the side effect (a checkpoint
rename, an edit) run at most once (:class:`~resources.ledger.retry.Once`).
"""

from collections.abc import Callable
from typing import TypeVar

import sqlalchemy as sa

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import SETTLED_RESULT, StepStatus
from resources.ledger import pointers
from resources.ledger.retry import Once
from resources.ledger.session import LedgerSession, now_text
from resources.ledger.tables import step_run

T = TypeVar("T")


class Publishing(LedgerSession):
    """Work under the row lock, commit pointers and seals."""

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
            with self._write() as conn:
                locked = conn.execute(
                    sa.select(step_run.c.id).where(self._owned(key, run_id)).with_for_update()
                ).first()
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

        return self._retry("publish", body, callbacks=(once,))

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
            with self._write() as conn:
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

        return self._retry("swap a commit pointer", body)

    def adopt_pointer(self, key: StepKey, pointer: str, now: str | None = None) -> bool:
        """First pointer of a settled row that has none (``storyboard storage migrate``);
        False when the row is running, absent or already publishes one. Idempotent."""
        ts = now or now_text()

        def body(attempt: int) -> bool:
            with self._write() as conn:
                if attempt > 1 and pointers.current_pointer(conn, key) == pointer:
                    return True
                return pointers.adopt_pointer(conn, key, pointer, now=ts)

        return self._retry("adopt a commit pointer", body)

    def clear_seal(self, key: StepKey, seal: str, now: str | None = None) -> bool:
        """Drop ``seal`` from ``key``'s row while it still carries it (a scrub found the
        storage drifted from it); False when the row holds another seal by now."""
        ts = now or now_text()

        def body(attempt: int) -> bool:
            with self._write() as conn:
                return pointers.clear_seal(conn, key, seal, now=ts)

        return self._retry("clear a seal", body)

    def clear_episode_seals(self, project_id: str, episode_id: str) -> int:
        """Drop every seal of one episode's rows (its inputs were replaced)."""
        ts = now_text()

        def body(attempt: int) -> int:
            with self._write() as conn:
                return pointers.clear_episode_seals(conn, project_id, episode_id, now=ts)

        return self._retry("clear an episode's seals", body)

    def archived_pointers(self, key: StepKey) -> list[str]:
        """The step's replaced commit pointers, newest first."""
        return self._in_read(
            "read archived pointers", lambda conn: pointers.archived_pointers(conn, key)
        )

    def references(self) -> pointers.References:
        """Every commit pointer (current and archived) and every claim: what object-storage
        garbage collection must keep."""
        return self._in_read("read references", pointers.referenced)

    def with_settled_row(
        self,
        key: StepKey,
        fn: Callable[[], T],
        *,
        reseal: bool = False,
        seal: str | None = None,
        pointer: str | None = None,
        reason: str = "mutation",
        run_id: str | None = None,
        keep_archives: int = 5,
    ) -> T:
        """Run ``fn`` under the row lock of a settled (completed/partial) row.

        Used by mutators to edit another step's checkpoint: refused while that step is
        running (its owner would publish over the edit) or has no completed result. With
        ``reseal`` the row's checkpoint seal becomes ``seal`` in the same transaction (a
        partial row never keeps one). ``pointer`` (object storage): the edited checkpoint's
        manifest, stored in the same transaction after ``fn`` (the compare-and-set) passed;
        the pointer it replaces is archived with ``reason``.
        """
        once = Once(fn)  # retried after a dropped connection: the edit runs at most once
        ts = now_text()

        def body(attempt: int) -> T:
            with self._write() as conn:
                landed = attempt > 1 and pointer is not None
                if landed and pointers.current_pointer(conn, key) == pointer:
                    return once()  # the commit landed: ``fn`` ran, its result is kept
                row = conn.execute(
                    sa.select(step_run.c.status, step_run.c.run_id)
                    .where(self._key_clause(key))
                    .with_for_update()
                ).first()
                if row is None or row.status not in SETTLED_RESULT:
                    status = "absent" if row is None else row.status
                    running = status == StepStatus.RUNNING
                    code = (
                        ErrorCode.STEP_VICTIM_RUNNING
                        if running
                        else ErrorCode.STEP_VICTIM_NOT_SETTLED
                    )
                    raise PipelineError(
                        code,
                        f"{key}: cannot edit its checkpoint while its ledger row is {status}",
                        status=409,
                    )
                if reseal:
                    completed = row.status == StepStatus.COMPLETED
                    conn.execute(
                        sa.update(step_run)
                        .where(self._key_clause(key))
                        .values(checkpoint_seal=seal if completed else None)
                    )
                result = once()
                if pointer is not None:
                    pointers.replace_pointer(
                        conn, key, pointer, reason=reason, run_id=run_id, keep=keep_archives, now=ts
                    )
                return result

        return self._retry("edit a settled row", body, callbacks=(once,))
