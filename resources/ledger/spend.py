"""Money in the ledger (docs/DESIGN.md#money-budgets): a call's worst case reserved under
the episode's and the project-day's budgets in the transaction that records it, settled to
its real cost when its reply comes, and the spend read back for ``storyboard status``.

The reservation is a conditional UPDATE of the episode's ``episode_calls`` row, then of the
project's ``project_day_spend`` row, after the step's row and the call count (the order every
writer takes these locks in): PostgreSQL's row locks, SQLite's write lock. Of processes
racing for a budget's last money the later ones find it spent, so a budget is never
exceeded by what is reserved. A refused call records and counts nothing (its transaction
rolls back).
"""

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.money import EPISODE_MONEY, PROJECT_DAY_MONEY, Reservation, Usage
from pipeline_defs.resume.partition import StepKey
from resources.ledger import cost_statements, spend_statements
from resources.ledger.session import LedgerSession, now_text


def _refused(budget: str, spent: int, limit: int, reserve: int, key: StepKey) -> PipelineError:
    return PipelineError(
        ErrorCode.BUDGET_EXHAUSTED,
        f"{key}: the {budget} budget has {spent} micro-units spent or reserved of {limit}; "
        f"the call's worst case of {reserve} does not fit",
        details={"budget": budget, "spent": spent, "limit": limit, "reserve": reserve},
    )


def reserve(conn: Connection, key: StepKey, held: Reservation, *, sqlite: bool, day: str) -> None:
    """Count a call of ``key`` in its project's row of ``day`` and reserve ``held.micros`` for
    it (its episode's ``episode_calls`` row is seeded already, by the call count), within
    each budget set; ``budget.exhausted`` naming the budget that has not the room."""
    micros = held.micros
    if held.touches_money:
        update = spend_statements.reserve_episode(key, micros, held.per_episode)
        if conn.execute(update).rowcount != 1:
            query = spend_statements.episode_spend(key.project_id, key.episode_id)
            spent = int(conn.execute(query).scalar_one())
            raise _refused(EPISODE_MONEY, spent, held.per_episode or 0, micros, key)
    update = spend_statements.reserve_project_day(
        key.project_id, day, micros, held.per_project_day, priced=held.price is not None
    )
    counted = conn.execute(update).rowcount == 1
    if (
        not counted
        and conn.execute(spend_statements.project_day_total(key.project_id, day)).first() is None
    ):
        # The day's first call of the project: its row, from the day's calls recorded so far
        # (read once a day, not per call), then the call counted in it.
        conn.execute(spend_statements.seed_project_day(sqlite, key.project_id, day))
        counted = conn.execute(update).rowcount == 1
    if not counted:
        query = spend_statements.project_day_total(key.project_id, day)
        spent = int(conn.execute(query).scalar_one())
        raise _refused(PROJECT_DAY_MONEY, spent, held.per_project_day or 0, micros, key)


@dataclass(frozen=True)
class SpendLine:
    """One episode's provider calls and money (spent or reserved, micro-units) on one day."""

    project_id: str
    episode_id: str
    day: str
    calls: int
    micros: int
    priced: int  # calls that had a price


@dataclass(frozen=True)
class SpendTotal:
    """The calls and money (spent or reserved, micro-units) of one episode, or of a whole
    project (``episode_id`` None), in all and on one UTC day."""

    project_id: str
    episode_id: str | None
    calls: int
    calls_today: int
    micros: int
    micros_today: int
    priced: int  # calls that had a price


class Spend:
    """Settling calls and reading the spend."""

    def __init__(self, session: LedgerSession) -> None:
        self.session = session

    def settle(
        self,
        call_id: int,
        *,
        units: int,
        model: str | None,
        usage: Usage | None,
        cost_micros: int | None,
    ) -> None:
        """The call's reply: its usage, and its cost in place of its reservation in the
        episode's and the day's spend (``cost_micros`` None: the reservation stands). Once:
        a retry after a lost answer finds the call finished and changes nothing."""
        now = now_text()

        def body(_attempt: int) -> None:
            with self.session.write() as conn:
                found = conn.execute(spend_statements.call_to_settle(call_id)).first()
                if found is None:
                    return
                project_id, episode_id, at, reserved = found
                conn.execute(
                    cost_statements.finish_call(
                        call_id, units=units, model=model, now=now, usage=usage, cost=cost_micros
                    )
                )
                delta = 0 if cost_micros is None else cost_micros - int(reserved)
                if delta:
                    conn.execute(spend_statements.shift_episode(project_id, episode_id, delta))
                    day = str(at)[:10]
                    conn.execute(spend_statements.shift_project_day(project_id, day, delta))

        self.session.retry("settle a provider call", body)

    def spend_lines(
        self, project_id: str | None = None, episodes: Iterable[tuple[str, str]] | None = None
    ) -> list[SpendLine]:
        """Every episode's calls and money per day (of one project, of ``episodes``:
        (project, episode) pairs, or of all)."""
        pairs = None if episodes is None else list(episodes)
        query = spend_statements.spend_by_episode(project_id, pairs)
        with self.session.single() as conn:
            rows = conn.execute(query).all()
        return [
            SpendLine(str(p), str(e), str(d), int(c), int(m), int(n)) for p, e, d, c, m, n in rows
        ]

    def episode_totals(
        self,
        today: str,
        episodes: Iterable[tuple[str, str]] | None = None,
        *,
        project_ids: Iterable[str] | None = None,
    ) -> list[SpendTotal]:
        """Per episode that recorded a call, of ``episodes`` ((project, episode) pairs), else
        of the projects ``project_ids``: its calls and money in all and of ``today``
        (``YYYY-MM-DD``, UTC). Only their rows are read."""
        pairs = None if episodes is None else list(episodes)
        projects = None if project_ids is None else sorted(set(project_ids))
        if pairs == [] or projects == [] or (pairs is None and projects is None):
            return []
        query = spend_statements.episode_totals(today, pairs, projects)
        rows = self.session.in_read("read the episodes' spend", lambda c: c.execute(query).all())
        return [
            SpendTotal(str(p), str(e), int(c), int(ct), int(m), int(mt), int(n))
            for p, e, c, ct, m, mt, n in rows
        ]

    def project_totals(self, today: str, project_ids: Iterable[str]) -> list[SpendTotal]:
        """Per project of ``project_ids`` that recorded a call: its calls and money in all
        and of ``today``, every episode together. Only those projects' rows are read."""
        projects = sorted(set(project_ids))
        if not projects:
            return []
        query = spend_statements.project_totals(today, projects)
        rows = self.session.in_read("read the projects' spend", lambda c: c.execute(query).all())
        return [
            SpendTotal(str(p), None, int(c), int(ct), int(m), int(mt), int(n))
            for p, c, ct, m, mt, n in rows
        ]
