"""Budgets in money in the ledger (docs/DESIGN.md#money-budgets): each call's worst case is
reserved in the transaction that records it, within the episode's and the project-day's
budgets, and settled to its real cost after; racing processes never take a budget past
its limit. On SQLite and on PostgreSQL.
"""

import itertools
import multiprocessing
import time
from typing import Any

import pytest
import sqlalchemy as sa

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.money import EPISODE_MONEY, PROJECT_DAY_MONEY, Reservation, Usage
from pipeline_defs.resume.partition import StepKey
from resources.ledger.store import LedgerStore
from resources.ledger.tables import episode_calls, project_day_spend, provider_call

KEY = StepKey("p1", "e1", "scene_image_pipeline")
OTHER_EPISODE = StepKey("p1", "e2", "scene_image_pipeline")


def _episode_micros(store: LedgerStore, key: StepKey) -> int:
    query = sa.select(episode_calls.c.cost_micros).where(
        episode_calls.c.project_id == key.project_id,
        episode_calls.c.episode_id == key.episode_id,
    )
    with store.session.single() as conn:
        return int(conn.execute(query).scalar_one())


def _day_micros(store: LedgerStore, project_id: str) -> int:
    query = sa.select(sa.func.coalesce(sa.func.sum(project_day_spend.c.cost_micros), 0)).where(
        project_day_spend.c.project_id == project_id
    )
    with store.session.single() as conn:
        return int(conn.execute(query).scalar_one())


def _rows_spent(store: LedgerStore, project_id: str, episode_id: str | None = None) -> int:
    """What the call rows say was spent: each settled cost, else its reservation."""
    spent = sa.func.coalesce(provider_call.c.cost_micros, provider_call.c.reserved_micros)
    query = sa.select(sa.func.coalesce(sa.func.sum(spent), 0)).where(
        provider_call.c.project_id == project_id
    )
    if episode_id is not None:
        query = query.where(provider_call.c.episode_id == episode_id)
    with store.session.single() as conn:
        return int(conn.execute(query).scalar_one())


def test_a_call_whose_worst_case_does_not_fit_is_refused_naming_the_budget(
    store: LedgerStore,
) -> None:
    """Before: calls were counted, never priced; nothing held a budget in money."""
    held = Reservation(400_000, per_episode=1_000_000, price='{"model": "m"}')
    first = store.start_provider_call(KEY, "run-a", kind="image", reservation=held)
    store.start_provider_call(KEY, "run-a", kind="image", reservation=held)
    with pytest.raises(PipelineError) as refused:
        store.start_provider_call(KEY, "run-a", kind="image", reservation=held)
    assert refused.value.code == ErrorCode.BUDGET_EXHAUSTED
    assert refused.value.details == {
        "budget": EPISODE_MONEY,
        "spent": 800_000,
        "limit": 1_000_000,
        "reserve": 400_000,
    }
    # the refused call recorded and counted nothing
    assert store.episode_calls("p1", "e1") == 2
    assert _episode_micros(store, KEY) == 800_000
    # settled to its real cost, the first call gives back what it did not use
    usage = Usage(input_tokens=1000, output_tokens=500, cached_input_tokens=200)
    store.finish_provider_call(
        first, units=1500, model="m", usage=usage, cost_micros=150_000, reserved_micros=400_000
    )
    # a retry after a lost answer changes nothing
    store.finish_provider_call(
        first, units=1500, model="m", usage=usage, cost_micros=150_000, reserved_micros=400_000
    )
    assert _episode_micros(store, KEY) == 550_000
    assert _day_micros(store, "p1") == 550_000
    row = next(r for r in store.provider_calls(episode=KEY.episode) if r["id"] == first)
    assert (row["input_tokens"], row["output_tokens"], row["cached_input_tokens"]) == (
        1000,
        500,
        200,
    )
    assert (row["reserved_micros"], row["cost_micros"], row["price"]) == (
        400_000,
        150_000,
        '{"model": "m"}',
    )
    store.start_provider_call(KEY, "run-a", kind="image", reservation=held)  # fits now
    assert _episode_micros(store, KEY) == _rows_spent(store, "p1", "e1") == 950_000


def test_a_failed_call_keeps_its_reservation(store: LedgerStore) -> None:
    held = Reservation(300_000, per_episode=1_000_000)
    call = store.start_provider_call(KEY, "run-a", kind="text", reservation=held)
    store.finish_provider_call(call, units=0, model="m")  # failed: its cost is unknown
    assert _episode_micros(store, KEY) == 300_000
    (row,) = store.provider_calls(episode=KEY.episode)
    assert (row["cost_micros"], row["reserved_micros"], row["finished_at"] is not None) == (
        None,
        300_000,
        True,
    )


def test_the_project_day_budget_spans_the_projects_episodes(store: LedgerStore) -> None:
    held = Reservation(600_000, per_project_day=1_000_000)
    store.start_provider_call(KEY, "run-a", kind="image", reservation=held)
    with pytest.raises(PipelineError) as refused:
        store.start_provider_call(OTHER_EPISODE, "run-b", kind="image", reservation=held)
    assert refused.value.details["budget"] == PROJECT_DAY_MONEY
    assert store.episode_calls("p1", "e2") == 0
    # another project has a day of its own
    store.start_provider_call(StepKey("p2", "e1", "s"), "run-c", kind="image", reservation=held)
    assert _day_micros(store, "p1") == 600_000


def test_every_call_is_counted_in_its_projects_day(store: LedgerStore) -> None:
    """The project's row of the day counts every call, priced or not, and what it reserved:
    ``status`` reads a project's spend from these rows, never from its calls. A refused call
    counts nothing."""
    store.start_provider_call(KEY, "run-a", kind="text")  # no price, no budget
    priced = Reservation(300_000, per_episode=500_000, price='{"model": "m"}')
    store.start_provider_call(KEY, "run-a", kind="image", reservation=priced)
    with pytest.raises(PipelineError):  # 600,000 would pass the episode's 500,000
        store.start_provider_call(KEY, "run-a", kind="image", reservation=priced)
    store.start_provider_call(OTHER_EPISODE, "run-b", kind="text")
    query = sa.select(
        project_day_spend.c.calls, project_day_spend.c.priced, project_day_spend.c.cost_micros
    ).where(project_day_spend.c.project_id == "p1")
    with store.session.single() as conn:
        rows = [tuple(row) for row in conn.execute(query).all()]
    assert rows == [(3, 1, 300_000)]
    (total,) = store.spend.project_totals(rows_day(store), ["p1"])
    assert (total.calls, total.calls_today, total.micros, total.priced) == (3, 3, 300_000, 1)


def rows_day(store: LedgerStore) -> str:
    with store.session.single() as conn:
        return str(conn.execute(sa.select(project_day_spend.c.day)).scalars().first())


# ------------------------------------------------------------- racing processes
PROCESSES = 4
TRIES = 15
RESERVE = 100_000  # 0.10 a call at worst
COST = 50_000  # 0.05 when settled
BUDGET = 1_000_000  # 1.00


def _contender(
    url: str, index: int, budget: str, barrier: Any, results: Any
) -> None:  # pragma: no cover - runs in a child process
    try:
        store = LedgerStore(url)
        if budget == EPISODE_MONEY:
            key = StepKey("p1", "e1", f"step_{index}")
            held = Reservation(RESERVE, per_episode=BUDGET)
        else:
            key = StepKey("p1", f"e{index}", "step")
            held = Reservation(RESERVE, per_project_day=BUDGET)
        taken: list[int] = []
        refused = 0
        barrier.wait(timeout=60)
        began = time.time()
        for _ in range(TRIES):
            try:
                call = store.start_provider_call(key, f"run-{index}", kind="text", reservation=held)
            except PipelineError as exc:
                if exc.code != ErrorCode.BUDGET_EXHAUSTED or exc.details["budget"] != budget:
                    raise
                refused += 1
                continue
            finally:
                # Let the others in between tries: SQLite's write lock is taken in turn.
                time.sleep(0.005)
            taken.append(call)
            store.finish_provider_call(
                call,
                units=10,
                model="m",
                usage=Usage(input_tokens=5, output_tokens=5),
                cost_micros=COST,
                reserved_micros=RESERVE,
            )
        results.put(("ok", index, taken, refused, began, time.time()))
    except BaseException as exc:
        results.put(("error", index, repr(exc), 0, 0.0, 0.0))


def _race(url: str, budget: str) -> None:
    store = LedgerStore(url)
    store.migrate()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_contender, args=(url, i, budget, barrier, results), daemon=True)
        for i in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    outcomes = []
    try:
        for _ in procs:
            outcomes.append(results.get(timeout=240))
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
    errors = [o for o in outcomes if o[0] != "ok"]
    assert not errors, errors
    taken = {call: o[1] for o in outcomes for call in o[2]}
    refused = sum(o[3] for o in outcomes)
    # It raced: every process's attempts overlapped every other's in time, and the calls
    # taken are several processes', interleaved (not one process after another).
    assert max(o[4] for o in outcomes) < min(o[5] for o in outcomes)
    owners = [taken[call] for call in sorted(taken)]
    switches = sum(1 for a, b in itertools.pairwise(owners) if a != b)
    assert len(set(owners)) >= 2 and switches >= 1, f"it did not race: {owners}"
    assert refused > 0 and len(taken) + refused == PROCESSES * TRIES
    # Never exceeded: what the rows spent, what the counters hold, within the budget.
    spent = _rows_spent(store, "p1")
    assert spent == len(taken) * COST <= BUDGET
    if budget == EPISODE_MONEY:
        assert _episode_micros(store, StepKey("p1", "e1", "x")) == spent
    else:
        assert _day_micros(store, "p1") == spent
    # a worst case more would have exceeded it: refusals were for want of room
    assert spent + RESERVE > BUDGET - PROCESSES * (RESERVE - COST)


@pytest.mark.parametrize("budget", [EPISODE_MONEY, PROJECT_DAY_MONEY])
def test_racing_processes_never_exceed_a_money_budget(db_url: str, budget: str) -> None:
    """Four processes, each reserving 15 calls at once against one budget of 1.00 (0.10 a
    call at worst, settled at 0.05): the spend ends within it, on both ledgers."""
    _race(db_url, budget)
