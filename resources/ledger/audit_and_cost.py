"""History lines written on their own (no status change of theirs) and provider-call rows,
the ledger's record of what each step paid for.

A change of status writes its history line in its own transaction instead
(:mod:`resources.ledger.audit`, docs/DESIGN.md#audit).
"""

import re

from sqlalchemy.engine import Connection

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.money import Reservation, Usage
from pipeline_defs.resume.partition import StepKey
from resources.ledger import cost_statements, spend, statements
from resources.ledger.audit import Audit, write_audit
from resources.ledger.session import LedgerSession, now_text

# A kind of model's word in the cost ledger (``ModelKind.name``): the column holds 8 characters.
_KIND_WORD = re.compile(r"[a-z][a-z0-9_]{0,7}")


def _count_call(conn: Connection, key: StepKey, cap: int | None, *, sqlite: bool) -> None:
    """Count one more call in the episode's ``episode_calls`` row, in the transaction that
    records it; refuse (``budget.exhausted``) if the episode has ``cap`` calls already.

    The conditional UPDATE takes the row's lock (PostgreSQL) or runs under the database's
    write lock (SQLite): of two steps of one episode racing for its last call, the second
    finds the count at the cap. A new episode's row starts at the calls it has recorded.
    """
    conn.execute(cost_statements.seed_episode_calls(sqlite, key))
    if conn.execute(cost_statements.count_call(key, cap)).rowcount == 1:
        return
    counted = cost_statements.episode_call_count(key.project_id, key.episode_id)
    spent = int(conn.execute(counted).scalar_one())
    raise PipelineError(
        ErrorCode.BUDGET_EXHAUSTED,
        f"{key}: episode has recorded {spent} provider calls, at its cap of {cap}",
        details={"spent": spent, "cap": cap},
    )


def _still_claimed(conn: Connection, key: StepKey, owner: str | None) -> None:
    """Lock ``key``'s row while ``owner``'s claim holds it (first: the claim before the
    episode's count, the order every writer takes them in); ``step.ownership_lost`` when it
    does not. ``owner`` None: a call made under no claim, not checked."""
    if owner is None or conn.execute(statements.lock_claim(key, owner)).first() is not None:
        return
    raise PipelineError(
        ErrorCode.STEP_OWNERSHIP_LOST,
        f"{key}: run {owner} lost its claim (taken over or settled); the provider call was "
        "not sent, nothing published",
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
        self,
        key: StepKey,
        run_id: str | None,
        *,
        kind: str,
        cap: int | None = None,
        claimed: bool = False,
        reservation: Reservation | None = None,
    ) -> int:
        """Record a call before it is sent (a kill during it leaves it unfinished).

        ``claimed``: the call is made under the claim whose fencing token is ``run_id``
        (docs/DESIGN.md#claim-tokens). It is recorded only while the step's row is running
        under that claim, checked under the row's lock in the transaction that records it;
        a claim taken over (by another run, or by a redelivery of the same task) is refused
        with ``step.ownership_lost``, recording and counting nothing, so its holder never
        sends the call.

        ``cap``: the episode's spend cap (docs/DESIGN.md#spend-cap). The call is counted in
        its episode's ``episode_calls`` row by a conditional UPDATE in the transaction that
        records it: two steps of one episode running at once never both take its last
        call. A call that would take the count past ``cap`` is refused, recording
        nothing: ``budget.exhausted`` with the count in ``details["spent"]``.

        ``reservation``: the call's worst case in money and the budgets it must fit
        (docs/DESIGN.md#money-budgets), reserved in the same transaction after the count
        (``resources.ledger.spend``); ``budget.exhausted`` naming the budget in
        ``details["budget"]`` when it does not fit, recording nothing.
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
        held = reservation or Reservation(0)
        values.update(reserved_micros=held.micros, price=held.price)
        day = str(values["at"])[:10]
        owner = run_id if claimed else None
        if self.session.is_sqlite:  # never retried (see _retry): the id comes back with the insert
            with self.session.write() as conn:  # BEGIN IMMEDIATE: the write lock, first
                _still_claimed(conn, key, owner)
                _count_call(conn, key, cap, sqlite=True)
                spend.reserve(conn, key, held, sqlite=True, day=day)
                inserted = conn.execute(cost_statements.record_call(values)).scalar_one()
            return int(inserted)
        # PostgreSQL: the row's id is drawn from its sequence before the insert is sent, so
        # an insert retried after a lost answer names the same row and a paid call is never
        # counted twice. One more round trip per provider call.
        allocated: list[int] = []

        def body(_attempt: int) -> int:
            if not allocated:
                with self.session.single() as conn:
                    allocated.append(int(conn.execute(cost_statements.NEXT_CALL_ID).scalar_one()))
            with self.session.write() as conn:
                # A retry after a commit whose answer was lost finds its own row: done.
                if conn.execute(cost_statements.call_by_id(allocated[0])).first() is None:
                    _still_claimed(conn, key, owner)
                    _count_call(conn, key, cap, sqlite=False)
                    spend.reserve(conn, key, held, sqlite=False, day=day)
                    conn.execute(cost_statements.record_call({"id": allocated[0], **values}))
            return allocated[0]

        return self.session.retry("record a provider call", body)

    def finish_provider_call(
        self,
        call_id: int,
        *,
        units: int,
        model: str | None,
        usage: Usage | None = None,
        cost_micros: int | None = None,
        reserved_micros: int = 0,
    ) -> None:
        """Record what a started call used and cost (``resources.ledger.spend``)."""
        if cost_micros is None or cost_micros == reserved_micros:
            # Fixed values by primary key: run twice after a lost answer, the same row
            # results (the reservation stands as its cost, or is its cost exactly).
            statement = cost_statements.finish_call(
                call_id, units=units, model=model, now=now_text(), usage=usage, cost=cost_micros
            )
            self.session.in_single("finish a provider call", lambda conn: conn.execute(statement))
            return
        # Its cost in place of its reservation, in the same transaction, once.
        spend.Spend(self.session).settle(
            call_id, units=units, model=model, usage=usage, cost_micros=cost_micros
        )

    def note_episode_estimate(self, project_id: str, episode_id: str, estimated: int) -> None:
        """Record the calls an episode's story is estimated at (``add-episode``)."""
        statement = cost_statements.note_estimate(
            self.session.is_sqlite, project_id, episode_id, estimated
        )
        self.session.in_single("note the episode's estimate", lambda conn: conn.execute(statement))

    def record_provider_call(
        self, key: StepKey, run_id: str | None, *, kind: str, units: int, model: str | None
    ) -> None:
        """A finished call in one go (for callers that learn of a call afterwards)."""
        self.finish_provider_call(
            self.start_provider_call(key, run_id, kind=kind), units=units, model=model
        )
