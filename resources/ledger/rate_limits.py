"""The shared rate limit (docs/DESIGN.md#rate-limit): one ``rate_limit`` row per endpoint
and model that every process reserves its calls from, in one short transaction under the
row lock (``SELECT ... FOR UPDATE`` on PostgreSQL, the write lock on SQLite), and the
``rate_wait`` notes ``storyboard status`` reads. The arithmetic is :mod:`resources.ledger.gcra`.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from pipeline_defs.resume.partition import StepKey
from resources.ledger import rate_statements
from resources.ledger.gcra import Limits, RateState, pause, reserve, settle
from resources.ledger.session import LedgerSession, now_text

# ``(state, now) -> (new state, result)``: a change of one row under its lock.
Change = Callable[[RateState, float], tuple[RateState, float]]


@dataclass(frozen=True)
class RateWait:
    """A step waiting for the rate limit (a ``rate_wait`` row)."""

    key: StepKey
    run_id: str | None
    endpoint: str
    model: str
    until: str


class RateLimits:
    """The ``rate_limit`` and ``rate_wait`` tables."""

    def __init__(self, session: LedgerSession) -> None:
        self.session = session

    def _now(self, conn: Connection) -> float:
        if self.session.is_sqlite:
            return time.time()
        return float(conn.execute(rate_statements.PG_NOW).scalar_one())

    def _change(self, what: str, endpoint: str, model: str, change: Change) -> float:
        """Run ``change`` on the row's state under its lock; returns what it returns."""
        on_sqlite = self.session.is_sqlite

        def body(_attempt: int) -> float:
            with self.session.write() as conn:
                stamp = now_text()
                conn.execute(rate_statements.seed_rate(on_sqlite, endpoint, model, stamp))
                row = conn.execute(rate_statements.lock_rate(on_sqlite, endpoint, model)).one()
                state = RateState(float(row[0]), float(row[1]), float(row[2]))
                after, result = change(state, self._now(conn))
                if after != state:
                    conn.execute(rate_statements.write_rate(endpoint, model, after, stamp))
                return result

        return self.session.retry(what, body)

    def reserve(self, endpoint: str, model: str, limits: Limits, tokens: int = 0) -> float:
        """Reserve the next slot for one call; returns the seconds until it (0: go now)."""
        return self._change(
            "reserve a rate slot",
            endpoint,
            model,
            lambda state, now: reserve(state, limits, now, tokens),
        )

    def pause(self, endpoint: str, model: str, seconds: float) -> float:
        """The endpoint answered 429 with ``Retry-After: seconds``: every process's calls to
        it wait that long. Returns the seconds the pause now lasts."""

        def change(state: RateState, now: float) -> tuple[RateState, float]:
            after = pause(state, now, seconds)
            return after, after.paused_until - now

        return self._change("pause a rate limit", endpoint, model, change)

    def settle(
        self, endpoint: str, model: str, limits: Limits, *, estimated: int, used: int
    ) -> None:
        """A call's estimated tokens replaced by the tokens the endpoint reported."""
        if not limits.tokens_per_minute or used == estimated:
            return
        self._change(
            "settle a rate slot",
            endpoint,
            model,
            lambda state, _now: (settle(state, limits, estimated, used), 0.0),
        )

    def paused_for(self, endpoint: str, model: str) -> float:
        """Seconds the endpoint and model are paused for now (0: not paused)."""

        def read(conn: Connection) -> float:
            until = conn.execute(rate_statements.paused_until(endpoint, model)).scalar()
            return 0.0 if until is None else max(0.0, float(until) - self._now(conn))

        return self.session.in_read("read a rate pause", read)

    def note_wait(
        self, key: StepKey, run_id: str | None, endpoint: str, model: str, until: str
    ) -> None:
        statement = rate_statements.note_wait(
            self.session.is_sqlite, key, run_id, endpoint, model, until
        )
        self.session.in_single("note a rate wait", lambda conn: conn.execute(statement))

    def clear_wait(self, key: StepKey, run_id: str | None) -> None:
        statement = rate_statements.clear_wait(key, run_id)
        self.session.in_single("clear a rate wait", lambda conn: conn.execute(statement))

    def waits(self) -> dict[StepKey, RateWait]:
        """The steps waiting for a rate limit now, by key."""

        def read(conn: Connection) -> dict[StepKey, RateWait]:
            found: dict[StepKey, RateWait] = {}
            for r in conn.execute(rate_statements.waits()).mappings():
                key = StepKey(str(r["project_id"]), str(r["episode_id"]), str(r["step_id"]))
                found[key] = RateWait(
                    key, r["run_id"], str(r["endpoint"]), str(r["model"]), str(r["until"])
                )
            return found

        return self.session.in_read("read rate waits", read)
