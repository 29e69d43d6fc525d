"""Big batches are judged in worker processes: same launches and blocks as in-process."""

from datetime import UTC, datetime
from pathlib import Path

from sensor_steps import SENSOR_STEPS, Src, seed, stores_for, write_input

from pipeline_defs.resume.partition import StepKey
from sensors.evaluation import Verdict
from sensors.tick import ResumeTicker, TickConfig, TickResult


def _summary(result: TickResult) -> tuple[object, ...]:
    return (
        sorted(ev.run_key or "" for ev in result.launches),
        sorted((c.evaluation.step_id, c.evaluation.partition_key, c.passed) for c in result.checks),
        result.stats.judged,
        result.stats.blocked,
        result.stats.waiting,
    )


def _states(home: Path, sqlite_url: str):
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
        assert pooled_ticker._judge_pool is not None  # the workers really judged it
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
    assert ticker._pool_failed
    assert result.stats.judged == len(keys) * len(SENSOR_STEPS)
    assert {(e.step_id, e.partition_key) for e in result.launches} >= {("src", "p/e1")}
