"""Claim races (docs/DESIGN.md#claims): many contenders, one row, exactly one owner -- every round.

A persistent pool of contenders (spawned processes with their own engine, or threads) runs
hundreds of rounds. In each round every contender waits on a barrier, claims the same key,
then (still inside the round) proves what it owns with an owner-aware ledger write and a
shared "owners right now" counter. Only after a second barrier does the winner finish the
row, so a late loser can never legitimately win a settled row within the same round.

Round sets:
- ``fresh``: the row does not exist yet (first-run INSERT race);
- ``failed``: the row pre-exists as ``failed`` (ON CONFLICT DO UPDATE race);
- ``stale``: the row is running with a dead owner and every contender attempts the same
  automatic stale steal with the same expectations (two judges recovering at once); the
  recovery must be counted exactly once.
"""

import multiprocessing
import threading
import time
import traceback
import uuid
from collections import defaultdict
from typing import Any

import pytest
import sqlalchemy as sa

from pipeline_defs.resume.partition import StepKey
from resources.ledger.store import LedgerStore
from resources.ledger.tables import step_run

CONTENDERS = 8
# Rounds per round set: 200 first-run races, plus 100 each on pre-existing rows.
ROUNDS = {"fresh": 200, "failed": 100, "stale": 100}
PHASES = tuple(ROUNDS)
TOTAL_ROUNDS = sum(ROUNDS.values())
DEAD_STARTED = "2026-11-30T00:00:00.000000Z"
BARRIER_TIMEOUT = 60.0


def _keys(tag: str) -> dict[str, list[StepKey]]:
    return {
        phase: [StepKey(tag, f"{phase}{r}", "race") for r in range(ROUNDS[phase])]
        for phase in PHASES
    }


def _seed(store: LedgerStore, keys: dict[str, list[StepKey]]) -> None:
    rows = []
    for phase, status, run_id, started in (
        ("failed", "failed", "old-run", "2026-11-29T00:00:00.000000Z"),
        ("stale", "running", "dead-run", DEAD_STARTED),
    ):
        for key in keys[phase]:
            rows.append(
                {
                    "id": str(uuid.uuid4()),
                    "project_id": key.project_id,
                    "episode_id": key.episode_id,
                    "step_id": key.step_id,
                    "status": status,
                    "run_id": run_id,
                    "started_at": started,
                    "created_at": started,
                    "updated_at": started,
                    "recovery_count": 0,
                }
            )
    with store.engine.begin() as conn:
        conn.execute(sa.insert(step_run), rows)


class _Gauge:
    """How many contenders believe they own the round's row right now, and the peak."""

    def __init__(self, lock: Any, current: Any, peak: Any) -> None:
        self.lock, self.current, self.peak = lock, current, peak

    def enter(self) -> None:
        with self.lock:
            self.current.value += 1
            self.peak.value = max(self.peak.value, self.current.value)

    def leave(self) -> None:
        with self.lock:
            self.current.value -= 1


class _Box:
    def __init__(self) -> None:
        self.value = 0


def _contend(
    store: LedgerStore,
    index: int,
    keys: dict[str, list[StepKey]],
    barrier: Any,
    gauge: _Gauge,
) -> list[tuple[str, int, int, bool, bool, bool]]:
    """One contender's whole life: every phase, every round. Returns its observations."""
    seen = []
    for phase in PHASES:
        for r, key in enumerate(keys[phase]):
            run_id = f"{phase}-{r}-w{index}"
            if phase == "stale":
                kwargs: dict[str, Any] = {
                    "allow_stale_steal": True,
                    "expected_started_at": DEAD_STARTED,
                    "expected_run_id": "dead-run",
                    "auto_recovery": True,
                    "reason": "stale lease",
                }
            else:
                kwargs = {}
            barrier.wait(BARRIER_TIMEOUT)
            won = store.claim(key, run_id, **kwargs)
            if won:
                gauge.enter()
            # Owner-aware write: succeeds only for the row's current owner.
            holds = store.heartbeat(key, run_id)
            barrier.wait(BARRIER_TIMEOUT)  # everyone has claimed and probed
            finished = False
            if won:
                gauge.leave()
                finished = store.transition(key, run_id, "completed", summary=run_id)
            seen.append((phase, r, index, won, holds, finished))
    return seen


def _process_contender(
    url: str,
    index: int,
    keys: dict[str, list[StepKey]],
    barrier: Any,
    lock: Any,
    current: Any,
    peak: Any,
    results: Any,
) -> None:
    try:
        store = LedgerStore(url)  # its own engine, created in this process
        store.migrate()
        seen = _contend(store, index, keys, barrier, _Gauge(lock, current, peak))
        results.put(("ok", index, seen))
    except BaseException:
        barrier.abort()  # release everyone else at once instead of after the timeout
        results.put(("error", index, traceback.format_exc()))


def _check(
    store: LedgerStore,
    keys: dict[str, list[StepKey]],
    seen: list[tuple[str, int, int, bool, bool, bool]],
    peak: int,
) -> None:
    assert len(seen) == CONTENDERS * TOTAL_ROUNDS
    winners: dict[tuple[str, int], list[int]] = defaultdict(list)
    for phase, r, index, won, holds, finished in seen:
        assert holds == won, (phase, r, index, won, holds)  # losers own nothing, winners do
        assert finished == won, (phase, r, index)
        if won:
            winners[(phase, r)].append(index)
    bad = {k: v for k, v in winners.items() if len(v) != 1}
    assert not bad, f"rounds without exactly one winner: {sorted(bad.items())[:10]}"
    assert len(winners) == TOTAL_ROUNDS
    assert peak == 1, f"max concurrent owners was {peak}"

    rows = store.get_many()
    for phase in PHASES:
        for r, key in enumerate(keys[phase]):
            row = rows[key]
            (index,) = winners[(phase, r)]
            run_id = f"{phase}-{r}-w{index}"
            assert (row.status, row.run_id, row.result_summary) == (
                "completed",
                run_id,
                run_id,
            )
            if phase == "stale":
                assert row.recovery_count == 1, (key, row.recovery_count)
                assert row.last_recovery_reason == "stale lease"
            else:
                assert row.recovery_count == 0


def _run_processes(url: str, tag: str) -> float:
    store = LedgerStore(url)
    store.migrate()
    keys = _keys(tag)
    _seed(store, keys)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(CONTENDERS)
    lock = ctx.Lock()
    current = ctx.Value("i", 0, lock=False)
    peak = ctx.Value("i", 0, lock=False)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_process_contender,
            args=(url, i, keys, barrier, lock, current, peak, results),
            daemon=True,
        )
        for i in range(CONTENDERS)
    ]
    started = time.monotonic()
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
    elapsed = time.monotonic() - started
    errors = [o for o in outcomes if o[0] != "ok"]
    assert not errors, errors[0][2]
    seen = [s for o in outcomes for s in o[2]]
    _check(store, keys, seen, peak.value)
    print(f"{CONTENDERS} contenders x {TOTAL_ROUNDS} rounds in {elapsed:.1f}s")
    return elapsed


@pytest.mark.pg
def test_postgres_process_claim_race(pg_url: str) -> None:
    _run_processes(pg_url, "pgproc")


def test_sqlite_process_claim_race(sqlite_url: str) -> None:
    _run_processes(sqlite_url, "liteproc")


def _run_threads(url: str, tag: str) -> float:
    store = LedgerStore(url)
    store.migrate()
    keys = _keys(tag)
    _seed(store, keys)
    barrier = threading.Barrier(CONTENDERS)
    current, peak = _Box(), _Box()
    gauge = _Gauge(threading.Lock(), current, peak)
    outcomes: dict[int, Any] = {}

    def contender(index: int) -> None:
        try:
            outcomes[index] = ("ok", _contend(LedgerStore(url), index, keys, barrier, gauge))
        except BaseException:
            barrier.abort()
            outcomes[index] = ("error", traceback.format_exc())

    threads = [
        threading.Thread(target=contender, args=(i,), daemon=True) for i in range(CONTENDERS)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    elapsed = time.monotonic() - started
    assert len(outcomes) == CONTENDERS, "a contender thread hung"
    errors = [o for o in outcomes.values() if o[0] != "ok"]
    assert not errors, errors[0][1]
    seen = [s for o in outcomes.values() for s in o[1]]
    _check(store, keys, seen, peak.value)
    print(f"{CONTENDERS} contenders x {TOTAL_ROUNDS} rounds in {elapsed:.1f}s")
    return elapsed


def test_sqlite_thread_claim_race(sqlite_url: str) -> None:
    _run_threads(sqlite_url, "litethread")


def test_gauge_detects_two_owners() -> None:
    """The single-owner gauge is not vacuous: two overlapping owners read as a peak of 2."""
    current, peak = _Box(), _Box()
    gauge = _Gauge(threading.Lock(), current, peak)
    gauge.enter()
    gauge.enter()
    gauge.leave()
    gauge.leave()
    assert (current.value, peak.value) == (0, 2)
