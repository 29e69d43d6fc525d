"""Scale: big batches judged in worker processes (same verdicts), and the tick budget."""

from datetime import UTC, datetime
from pathlib import Path

import pytest
from sensor_steps import SENSOR_STEPS, Src, seed, stores_for, write_input

import pipeline_defs.judging.dispatch as dispatch_module
from pipeline_defs.judging.step_evaluation import Verdict
from pipeline_defs.judging.stores import Stores
from pipeline_defs.judging.tick import ResumeTicker
from pipeline_defs.judging.tick_result import TickConfig, TickResult
from pipeline_defs.resume.partition import StepKey


def _summary(result: TickResult) -> tuple[object, ...]:
    return (
        sorted(ev.run_key or "" for ev in result.launches),
        sorted((c.evaluation.step_id, c.evaluation.partition_key, c.passed) for c in result.checks),
        result.stats.judged,
        result.stats.blocked,
        result.stats.waiting,
    )


def _states(home: Path, sqlite_url: str) -> tuple[Stores, list[str]]:
    stores = stores_for(home, sqlite_url)
    for n in range(5):
        seed(stores, f"p/e{n}")
    key = StepKey("p", "e1", "src")
    assert stores.ledger.claim(key, "r:0") and stores.ledger.transition(key, "r:0", "failed")
    write_input(home, "p/e2", "verify.json", {"mid": "drift"})
    (stores.checkpoints.step_dir(StepKey("p", "e3", "mid")) / "frames" / "f0.png").unlink()
    return stores, [f"p/e{n}" for n in range(7)]  # e5, e6: never run


def test_workers_reach_the_same_verdicts(sqlite_url: str, pipeline_home: Path) -> None:
    stores, keys = _states(pipeline_home, sqlite_url)
    now = datetime.now(UTC)
    alone = ResumeTicker(SENSOR_STEPS, stores, TickConfig(workers=1)).tick(keys, now, None)
    pooled_ticker = ResumeTicker(SENSOR_STEPS, stores, TickConfig(workers=2, parallel_from=1))
    try:
        pooled = pooled_ticker.tick(keys, now, None)
        assert pooled_ticker.dispatch.pool is not None  # the workers really judged it
    finally:
        pooled_ticker.close()
    assert _summary(pooled) == _summary(alone)
    assert alone.stats.judged == len(keys) * len(SENSOR_STEPS)
    assert {(e.step_id, e.partition_key) for e in pooled.evaluations} == {
        (e.step_id, e.partition_key) for e in alone.evaluations if e.verdict is not Verdict.SKIP
    }
    assert {ev.decision for ev in pooled.evaluations} <= {ev.decision for ev in alone.evaluations}


def test_a_broken_pool_falls_back_to_judging_in_process(
    sqlite_url: str, pipeline_home: Path
) -> None:
    stores, keys = _states(pipeline_home, sqlite_url)
    local = type("Unpicklable", (Src,), {"step_id": "src"})  # no importable class path
    steps = (local(), *SENSOR_STEPS[1:])
    ticker = ResumeTicker(steps, stores, TickConfig(workers=2, parallel_from=1))
    try:
        result = ticker.tick(keys, datetime.now(UTC), None)
    finally:
        ticker.close()
    assert ticker.dispatch.pool_failed
    assert result.stats.judged == len(keys) * len(SENSOR_STEPS)
    assert {(e.step_id, e.partition_key) for e in result.launches} >= {("src", "p/e1")}


def test_a_tick_over_budget_leaves_the_rest_for_the_next_ticks(
    sqlite_url: str, pipeline_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dagster gives a sensor evaluation 60 s: a huge cold start is spread over ticks."""
    monkeypatch.setattr(dispatch_module, "_BUDGET_SLICE", 1)
    stores = stores_for(pipeline_home, sqlite_url)
    keys = ["p/e1", "p/e2", "p/e3"]  # never run: one run of first runs each
    ticker = ResumeTicker(SENSOR_STEPS, stores, TickConfig(workers=1, budget_seconds=0))
    now = datetime.now(UTC)
    cursor, launched = None, []
    for expected_pending in (2, 1, 0):
        result = ticker.tick(keys, now, cursor)
        assert (result.stats.evaluated_partitions, result.stats.pending) == (1, expected_pending)
        launched += [run[0].partition_key for run in result.runs]
        cursor = result.cursor
    assert sorted(launched) == keys
    assert ticker.tick(keys, now, cursor).stats.mode == "unchanged"


def test_a_cold_start_over_budget_takes_what_fits_and_reads_only_those_rows(
    sqlite_url: str, pipeline_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick continuing a cold start judges the never-judged partitions its budget fits,
    at the pace of the last tick, and reads only their ledger rows (not the whole ledger);
    a change to a partition judged before is never left for later. Every partition is
    judged once, and each launch is requested once."""
    import dataclasses

    import pipeline_defs.judging.tick as tick_module

    monkeypatch.setattr(dispatch_module, "_BUDGET_SLICE", 1)
    monkeypatch.setattr(tick_module, "_BACKLOG_MIN", 1)
    stores = stores_for(pipeline_home, sqlite_url)
    keys = [f"p/e{n}" for n in range(7)]
    for pk in keys:
        seed(stores, pk)
    key = StepKey("p", "e4", "src")
    assert stores.ledger.claim(key, "r:0") and stores.ledger.transition(key, "r:0", "failed")
    steps = len(SENSOR_STEPS)
    # More than max_targeted partitions to judge read the whole ledger before this change.
    config = TickConfig(workers=1, budget_seconds=0, max_targeted=3)
    ticker = ResumeTicker(SENSOR_STEPS, stores, config)
    now = datetime.now(UTC)
    first = ticker.tick(keys, now, None)  # a cold tick out of budget at once: one judged
    assert (first.stats.mode, first.stats.evaluated_partitions) == ("cold", 1)
    assert first.stats.pending == 6 and first.stats.rows_fetched == 7 * steps
    # From now on a budget of 100 s at 30 s a partition: 80 % of it fits two.
    ticker.config = dataclasses.replace(config, budget_seconds=100)
    ticker._pace = 30.0

    cursor, launched, seen = first.cursor, [], {"p/e0"}
    for n, pending in enumerate((4, 2, 0)):
        if n == 1:  # a picture of e0 (judged by the cold tick) deleted meanwhile
            (stores.checkpoints.step_dir(StepKey("p", "e0", "mid")) / "frames" / "f0.png").unlink()
        result = ticker.tick(keys, now, cursor)
        judged = {ev.partition_key for ev in result.evaluations} | {
            r[0].partition_key for r in result.runs
        }
        extra = 1 if n == 1 else 0  # e0 again: a change, never deferred
        assert (result.stats.evaluated_partitions, result.stats.pending) == (2 + extra, pending)
        assert result.stats.rows_fetched == (2 + extra) * steps  # those rows only
        launched += [run[0].partition_key for run in result.runs]
        seen |= judged
        cursor = result.cursor
    assert sorted(launched) == ["p/e0", "p/e4"]  # each once
    assert ticker.tick(keys, now, cursor).stats.mode == "unchanged"


def test_a_refresh_over_budget_keeps_what_it_knew_and_goes_on_where_it_stopped(
    sqlite_url: str, pipeline_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The periodic full refresh of a big ledger takes several ticks: the partitions it
    has not reached keep their memos (before, it threw them away and the next ticks judged
    them as new, reading the whole ledger), and the next ticks take them in budget-sized
    slices until the refresh is through; nothing settled is launched."""
    import dataclasses
    from datetime import timedelta

    import pipeline_defs.judging.tick as tick_module

    monkeypatch.setattr(tick_module, "_BACKLOG_MIN", 1)
    stores = stores_for(pipeline_home, sqlite_url)
    keys = [f"p/e{n}" for n in range(7)]
    for pk in keys:
        seed(stores, pk)
    steps = len(SENSOR_STEPS)
    config = TickConfig(workers=1, max_targeted=3)
    ticker = ResumeTicker(SENSOR_STEPS, stores, config)
    now = datetime.now(UTC)
    cold = ticker.tick(keys, now, None)
    assert (cold.stats.evaluated_partitions, cold.stats.pending) == (7, 0)

    monkeypatch.setattr(dispatch_module, "_BUDGET_SLICE", 1)
    ticker.config = dataclasses.replace(config, budget_seconds=0)
    later = now + timedelta(seconds=config.full_refresh_seconds + 1)
    full = ticker.tick(keys, later, cold.cursor)
    assert (full.stats.mode, full.stats.evaluated_partitions) == ("full", 1)
    assert full.stats.pending == 6
    assert set(ticker._memos) == set(keys)  # what it did not reach is still known

    ticker.config = dataclasses.replace(config, budget_seconds=100)
    ticker._pace = 30.0  # 80 % of 100 s at 30 s a partition: two a tick
    cursor, refreshed = full.cursor, 1
    for pending in (4, 2, 0):
        result = ticker.tick(keys, later, cursor)
        assert result.stats.changed == {"refresh": 2}
        assert (result.stats.evaluated_partitions, result.stats.pending) == (2, pending)
        assert result.stats.rows_fetched == 2 * steps  # theirs only, not the ledger
        assert result.runs == []
        refreshed += result.stats.evaluated_partitions
        cursor = result.cursor
    assert refreshed == len(keys)
    assert ticker.tick(keys, later, cursor).stats.mode == "unchanged"
