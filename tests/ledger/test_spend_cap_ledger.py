"""The spend cap in the ledger (docs/DESIGN.md#spend-cap): a call is counted (a conditional
UPDATE of its episode's ``episode_calls`` row) and recorded in one transaction, so no two
steps of one episode both take its last call; a refused call records nothing. On SQLite
and on PostgreSQL, with real threads.
"""

import threading
from collections import Counter

import pytest
import sqlalchemy as sa

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from resources.ledger.store import LedgerStore
from resources.ledger.tables import episode_calls

KEY = StepKey("p1", "e1", "scene_image_pipeline")
SIBLING = StepKey("p1", "e1", "ref_image_gen")
OTHER_EPISODE = StepKey("p1", "e2", "scene_image_pipeline")


def test_a_call_past_the_cap_is_refused_and_records_nothing(store: LedgerStore) -> None:
    """Before: ``start_provider_call`` took no cap; every call was recorded."""
    for _ in range(2):
        store.start_provider_call(KEY, "run-a", kind="image", cap=3)
    store.start_provider_call(SIBLING, "run-b", kind="text", cap=3)  # the episode's, all steps
    with pytest.raises(PipelineError) as refused:
        store.start_provider_call(KEY, "run-a", kind="image", cap=3)
    assert refused.value.code == ErrorCode.BUDGET_EXHAUSTED
    assert refused.value.details == {"spent": 3, "cap": 3}
    assert store.episode_calls("p1", "e1") == 3
    assert len(store.provider_calls(episode=KEY.episode)) == 3
    # Another episode has its own count; no cap, no refusal (what callers without one do).
    store.start_provider_call(OTHER_EPISODE, "run-c", kind="image", cap=3)
    store.start_provider_call(KEY, "run-d", kind="image")
    assert store.episode_calls("p1", "e1") == 4
    assert store.episode_calls("p1", "e2") == 1


def _race(store: LedgerStore, *, threads: int, tries: int, cap: int) -> tuple[int, int]:
    """``threads`` steps of one episode each trying ``tries`` calls at once: (taken, refused)."""
    outcomes: Counter[str] = Counter()
    failures: list[BaseException] = []
    gate = threading.Barrier(threads)
    lock = threading.Lock()

    def step(n: int) -> None:
        key = StepKey(KEY.project_id, KEY.episode_id, f"step_{n}")
        gate.wait()
        for _ in range(tries):
            try:
                store.start_provider_call(key, f"run-{n}", kind="image", cap=cap)
                outcome = "taken"
            except PipelineError as exc:
                if exc.code != ErrorCode.BUDGET_EXHAUSTED:
                    failures.append(exc)
                outcome = "refused"
            except BaseException as exc:  # reported by the test thread
                failures.append(exc)
                return
            with lock:
                outcomes[outcome] += 1

    workers = [threading.Thread(target=step, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures, failures
    return outcomes["taken"], outcomes["refused"]


def test_concurrent_steps_never_both_take_the_last_call(store: LedgerStore) -> None:
    """Eight steps of one episode race for 13 calls, 40 tries in all: exactly 13 are
    recorded, on PostgreSQL (the counter row's lock) and SQLite (its write lock). A count
    of the episode's rows then an insert, unlocked, let two transactions interleave and
    the episode end past its cap (seen on PostgreSQL: 14 to 16 rows for a cap of 13)."""
    taken, refused = _race(store, threads=8, tries=5, cap=13)
    assert (taken, refused) == (13, 27)
    assert store.episode_calls(KEY.project_id, KEY.episode_id) == 13
    assert len(store.provider_calls(episode=KEY.episode)) == 13


def test_the_count_starts_at_the_calls_an_episode_recorded_before_it(store: LedgerStore) -> None:
    """An episode whose calls predate its counter row (recorded by an older worker) starts
    at them, not at zero: the cap counts every recorded call."""
    store.start_provider_call(KEY, "run-a", kind="text")
    with store.engine.begin() as conn:
        conn.execute(sa.delete(episode_calls))  # as before the counter existed
    assert store.episode_calls("p1", "e1") == 0
    store.start_provider_call(KEY, "run-a", kind="text", cap=5)
    assert store.episode_calls("p1", "e1") == 2
