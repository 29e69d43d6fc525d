"""History lines written on their own (no status change of theirs) and provider-call rows,
the ledger's record of what each step paid for.

A change of status writes its history line in its own transaction instead
(:mod:`resources.ledger.audit`, docs/DESIGN.md#audit).
"""

import hashlib

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from resources.ledger.audit import Audit, write_audit
from resources.ledger.session import LedgerSession, now_text
from resources.ledger.tables import provider_call

# The next provider_call id on PostgreSQL (drawn before the insert: see start_provider_call).
_NEXT_CALL_ID = sa.select(
    sa.func.nextval(sa.func.pg_get_serial_sequence(provider_call.name, provider_call.c.id.name))
)


def _episode_lock(key: StepKey) -> int:
    """The advisory lock id of ``key``'s episode's calls: a signed 64-bit digest."""
    digest = hashlib.sha256(f"provider_call/{key.project_id}/{key.episode_id}".encode())
    return int.from_bytes(digest.digest()[:8], "big", signed=True)


def _check_cap(conn: Connection, key: StepKey, cap: int) -> None:
    """Refuse (``budget.exhausted``) if the episode has recorded ``cap`` calls already.

    Called under the episode's lock, in the transaction that then records the call.
    """
    spent = int(
        conn.execute(
            sa.select(sa.func.count())
            .select_from(provider_call)
            .where(
                provider_call.c.project_id == key.project_id,
                provider_call.c.episode_id == key.episode_id,
            )
        ).scalar_one()
    )
    if spent >= cap:
        raise PipelineError(
            ErrorCode.BUDGET_EXHAUSTED,
            f"{key}: episode has recorded {spent} provider calls, at its cap of {cap}",
            details={"spent": spent, "cap": cap},
        )


class AuditAndCost:
    """Audit appends and provider-call (cost) rows."""

    def __init__(self, session: LedgerSession) -> None:
        self.session = session

    def append_transition(
        self,
        key: StepKey,
        *,
        action: str,
        from_status: str | None,
        to_status: str | None,
        origin: str | None = None,
        reason: str | None = None,
        run_id: str | None = None,
        launch_path: str | None = None,
        now: str | None = None,
    ) -> int:
        """A history line with no status change of its own (a SKIP, a block, an edit's
        note); a change of status takes its ``audit=`` in the same transaction instead."""
        audit = Audit(action, from_status, to_status, origin, reason, run_id, launch_path)
        return self.append_audit(key, audit, now=now)

    def append_audit(self, key: StepKey, audit: Audit, *, now: str | None = None) -> int:
        """``audit`` as a transaction of its own; its ``transition_seq``."""
        at = now or now_text()

        def body(attempt: int) -> int:
            with self.session.single() as conn:
                return write_audit(conn, key, audit, at, attempt=attempt)

        return self.session.retry("append transition", body)

    def start_provider_call(
        self, key: StepKey, run_id: str | None, *, kind: str, cap: int | None = None
    ) -> int:
        """Record a call before it is sent (a kill during it leaves it unfinished).

        ``cap``: the episode's spend cap (docs/DESIGN.md#spend-cap). The count of the
        episode's recorded calls and the new row are one step under a lock of the episode
        (an advisory transaction lock on PostgreSQL, SQLite's write lock): two steps of one
        episode running at once never both take its last call. A call that would take the
        count past ``cap`` is refused, recording nothing: ``budget.exhausted`` with the
        count in ``details["spent"]``.
        """
        if kind not in ("text", "image"):
            raise PipelineError(
                ErrorCode.INPUT_INVALID, f"provider call kind must be text or image, not {kind!r}"
            )
        values = {
            "project_id": key.project_id,
            "episode_id": key.episode_id,
            "step_id": key.step_id,
            "run_id": run_id,
            "kind": kind,
            "units": 0,
            "at": now_text(),
        }
        if self.session.is_sqlite:  # never retried (see _retry): the id comes back with the insert
            with self.session.write() as conn:  # BEGIN IMMEDIATE: the write lock, first
                if cap is not None:
                    _check_cap(conn, key, cap)
                inserted = conn.execute(
                    sa.insert(provider_call).values(values).returning(provider_call.c.id)
                ).scalar_one()
            return int(inserted)
        # PostgreSQL: the row's id is drawn from its sequence before the insert is sent, so
        # an insert retried after a lost answer names the same row (ON CONFLICT DO NOTHING)
        # and a paid call is never counted twice. One more round trip per provider call.
        allocated: list[int] = []

        def body(_attempt: int) -> int:
            if not allocated:
                with self.session.single() as conn:
                    allocated.append(int(conn.execute(_NEXT_CALL_ID).scalar_one()))
            insert = (
                postgresql.insert(provider_call)
                .values(id=allocated[0], **values)
                .on_conflict_do_nothing(index_elements=[provider_call.c.id])
            )
            if cap is None:
                with self.session.single() as conn:
                    conn.execute(insert)
                return allocated[0]
            with self.session.write() as conn:
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_episode_lock(key))))
                # A retry after a commit whose answer was lost finds its own row: done.
                mine = sa.select(provider_call.c.id).where(provider_call.c.id == allocated[0])
                if conn.execute(mine).first() is None:
                    _check_cap(conn, key, cap)
                    conn.execute(insert)
            return allocated[0]

        return self.session.retry("record a provider call", body)

    def finish_provider_call(self, call_id: int, *, units: int, model: str | None) -> None:
        # Fixed values by primary key: run twice after a lost answer, the same row results.
        statement = (
            sa.update(provider_call)
            .where(provider_call.c.id == call_id)
            .values(units=units, model=model, finished_at=now_text())
        )
        self.session.in_single("finish a provider call", lambda conn: conn.execute(statement))

    def record_provider_call(
        self, key: StepKey, run_id: str | None, *, kind: str, units: int, model: str | None
    ) -> None:
        """A finished call in one go (for callers that learn of a call afterwards)."""
        self.finish_provider_call(
            self.start_provider_call(key, run_id, kind=kind), units=units, model=model
        )
