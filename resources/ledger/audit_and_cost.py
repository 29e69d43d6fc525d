"""History lines written on their own (no status change of theirs) and provider-call rows,
the ledger's record of what each step paid for.

A change of status writes its history line in its own transaction instead
(:mod:`resources.ledger.audit`, docs/DESIGN.md#audit).
"""

import re

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from resources.ledger.audit import Audit, write_audit
from resources.ledger.session import LedgerSession, now_text
from resources.ledger.tables import episode_calls, provider_call

# A kind of model's word in the cost ledger (``ModelKind.name``): the column holds 8 characters.
_KIND_WORD = re.compile(r"[a-z][a-z0-9_]{0,7}")

# The next provider_call id on PostgreSQL (drawn before the insert: see start_provider_call).
_NEXT_CALL_ID = sa.select(
    sa.func.nextval(sa.func.pg_get_serial_sequence(provider_call.name, provider_call.c.id.name))
)


def _count_call(conn: Connection, key: StepKey, cap: int | None, *, sqlite: bool) -> None:
    """Count one more call in the episode's ``episode_calls`` row, in the transaction that
    records it; refuse (``budget.exhausted``) if the episode has ``cap`` calls already.

    The conditional UPDATE takes the row's lock (PostgreSQL) or runs under the database's
    write lock (SQLite): of two steps of one episode racing for its last call, the second
    finds the count at the cap. A new episode's row starts at the calls it has recorded.
    """
    where = (
        episode_calls.c.project_id == key.project_id,
        episode_calls.c.episode_id == key.episode_id,
    )
    recorded = (
        sa.select(sa.literal(key.project_id), sa.literal(key.episode_id), sa.func.count())
        .select_from(provider_call)
        .where(
            provider_call.c.project_id == key.project_id,
            provider_call.c.episode_id == key.episode_id,
        )
    )
    insert = sqlite_insert if sqlite else postgresql.insert
    conn.execute(
        insert(episode_calls)
        .from_select(["project_id", "episode_id", "calls"], recorded)
        .on_conflict_do_nothing()
    )
    within = (episode_calls.c.calls < cap,) if cap is not None else ()
    counted = conn.execute(
        sa.update(episode_calls).where(*where, *within).values(calls=episode_calls.c.calls + 1)
    )
    if counted.rowcount == 1:
        return
    spent = int(conn.execute(sa.select(episode_calls.c.calls).where(*where)).scalar_one())
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

        ``cap``: the episode's spend cap (docs/DESIGN.md#spend-cap). The call is counted in
        its episode's ``episode_calls`` row by a conditional UPDATE in the transaction that
        records it: two steps of one episode running at once never both take its last
        call. A call that would take the count past ``cap`` is refused, recording
        nothing: ``budget.exhausted`` with the count in ``details["spent"]``.
        """
        if not _KIND_WORD.fullmatch(kind):
            raise PipelineError(
                ErrorCode.INPUT_INVALID,
                f"provider call kind {kind!r} is not a kind's word (a lowercase word of at most "
                "8 characters: text, image, ...)",
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
                _count_call(conn, key, cap, sqlite=True)
                inserted = conn.execute(
                    sa.insert(provider_call).values(values).returning(provider_call.c.id)
                ).scalar_one()
            return int(inserted)
        # PostgreSQL: the row's id is drawn from its sequence before the insert is sent, so
        # an insert retried after a lost answer names the same row and a paid call is never
        # counted twice. One more round trip per provider call.
        allocated: list[int] = []

        def body(_attempt: int) -> int:
            if not allocated:
                with self.session.single() as conn:
                    allocated.append(int(conn.execute(_NEXT_CALL_ID).scalar_one()))
            with self.session.write() as conn:
                # A retry after a commit whose answer was lost finds its own row: done.
                mine = sa.select(provider_call.c.id).where(provider_call.c.id == allocated[0])
                if conn.execute(mine).first() is None:
                    _count_call(conn, key, cap, sqlite=False)
                    conn.execute(sa.insert(provider_call).values(id=allocated[0], **values))
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
