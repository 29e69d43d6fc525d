"""The run protocol and the judge on object storage, over in-memory fakes: no Dagster run,
no S3 server, no PostgreSQL, milliseconds per test.

The storage is ``MemoryStorage`` (``resources/testing.py``; the suites of
``tests/storage/`` run on it beside a directory, S3 and Azure, so it keeps their contract),
the ledger a real ``LedgerStore`` on an in-memory SQLite database (the ``memory_ledger``
fixture), the checkpoint store the product's over both (``tests/support/memory_machines.py``).
What ``tests/storage/test_pipeline_on_bucket.py`` shows on moto S3 through Dagster runs
holds here (docs/DESIGN.md#storage): a publish reaches another machine through the ledger
row alone, a deleted object is a self-only re-run, replaced bytes are a block naming the
object, and a worker that lost its claim never moves the pointer (docs/DESIGN.md#fencing).
"""

import functools
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from judge_steps import THIEF_RUN_ID, calls, set_knobs, step_key
from memory_machines import Machine, machines

from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.runner import OutcomeStatus
from resources.ledger.store import LedgerStore
from resources.testing import MemoryStorage

pytestmark = pytest.mark.unit

ALPHA = step_key("alpha")


@pytest.fixture
def new_machine(tmp_path: Path, memory_ledger: LedgerStore) -> Callable[[], Machine]:
    """A fresh machine per call (a new process: an empty scratch home), all on one
    in-memory ledger and one in-memory storage."""
    return functools.partial(next, machines(tmp_path, memory_ledger, MemoryStorage(tmp_path.name)))


def test_a_publish_on_one_machine_is_a_skip_on_another(new_machine: Callable[[], Machine]) -> None:
    first = new_machine()
    outcomes = first.run("alpha", "beta")
    assert {s: o.status for s, o in outcomes.items()} == {
        "alpha": OutcomeStatus.COMPLETED,
        "beta": OutcomeStatus.COMPLETED,
    }
    published = first.manifest("alpha")
    assert set(published.keys) <= set(first.storage.keys())
    assert not (first.home / "checkpoints").exists()  # the home is scratch

    second = new_machine()  # all it knows comes from the row and the storage
    assert second.judge("alpha").action is ResumeAction.SKIP
    again = second.run("alpha", "beta")
    assert {o.decision.action for o in again.values()} == {ResumeAction.SKIP}
    assert calls(second.home, "alpha") == calls(second.home, "beta") == []  # no body ran
    loaded = second.checkpoints.load(ALPHA)
    assert loaded is not None and loaded.content_hash == published.content_hash


def test_an_object_deleted_from_the_storage_is_a_self_only_rerun(
    new_machine: Callable[[], Machine],
) -> None:
    first = new_machine()
    first.run("alpha", "beta")
    published = first.manifest("alpha")
    relative, lost = sorted(published.artifacts.items())[0]
    first.storage.delete(lost.key)

    other = new_machine()
    decision = other.judge("alpha")
    assert decision.action is ResumeAction.RERUN_SELF, decision
    assert relative in decision.reason
    # the sensor's batch judgement (pipeline_defs/judging) sees it the same way
    evaluated = other.evaluate(datetime.now(UTC))
    assert evaluated["alpha"].decision.action is ResumeAction.RERUN_SELF
    assert evaluated["beta"].decision.action is not ResumeAction.RERUN_SELF

    rerun = other.run("alpha", "beta")
    assert rerun["alpha"].decision.action is ResumeAction.RERUN_SELF
    assert rerun["alpha"].status is OutcomeStatus.COMPLETED
    assert len(calls(other.home, "alpha")) == 1 and calls(other.home, "beta") == []
    redrawn = other.manifest("alpha").artifacts[relative]
    assert redrawn.sha256 == lost.sha256 and redrawn.key != lost.key  # a new attempt's object
    assert new_machine().judge("alpha").action is ResumeAction.SKIP


def test_an_envelope_replaced_in_the_storage_blocks_naming_the_object(
    new_machine: Callable[[], Machine],
) -> None:
    first = new_machine()
    first.run("alpha")
    envelope = first.manifest("alpha").envelope
    current = first.storage.head(envelope.key)
    assert current is not None
    edited = first.storage.get(envelope.key).replace(b"alpha-0", b"alpha-X")
    first.storage.put_if_match(envelope.key, edited, current)  # behind the ledger's back

    other = new_machine()
    decision = other.judge("alpha")
    assert decision.action is ResumeAction.BLOCK, decision
    assert envelope.key in decision.reason, decision.reason
    row = other.ledger.get(ALPHA)
    with pytest.raises(PipelineError) as blocked:
        other.run("alpha")
    assert blocked.value.code == ErrorCode.STEP_RESUME_BLOCKED
    assert calls(other.home, "alpha") == []
    assert other.ledger.get(ALPHA) == row  # a block claims nothing, writes no status


def test_a_worker_that_lost_its_claim_never_moves_the_pointer(
    new_machine: Callable[[], Machine], memory_ledger: LedgerStore
) -> None:
    """The worker's body loses its row to another owner (a stale-lease steal through a
    store of its own on the same database): its objects land in its own attempt, its
    publish matches no row, the published pointer and every object it names stay."""
    worker = new_machine()
    worker.run("alpha")
    published = worker.manifest("alpha")
    _, lost = sorted(published.artifacts.items())[0]
    worker.storage.delete(lost.key)  # a self-only re-run is due
    set_knobs(worker.home, "alpha", steal="claim")
    before = set(worker.storage.keys())

    with pytest.raises(PipelineError) as refused:
        worker.run("alpha")
    assert refused.value.code == ErrorCode.STEP_OWNERSHIP_LOST
    row = memory_ledger.get(ALPHA)
    assert row is not None and row.run_id == THIEF_RUN_ID and row.status is StepStatus.RUNNING
    assert row.checkpoint_pointer == published.encode()
    written = set(worker.storage.keys()) - before
    # nothing, or only its own dead attempt (stolen before a provider call: nothing at all)
    assert written.isdisjoint(published.keys)


def test_the_in_memory_ledger_is_one_database_for_every_thread(
    memory_ledger: LedgerStore,
) -> None:
    """Claims racing from threads meet one database (``sqlite://`` would give each thread
    an empty one of its own) and exactly one wins (docs/DESIGN.md#claims)."""
    won: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def claim(run_id: str) -> None:
        try:
            start.wait(5)
            if memory_ledger.claim(ALPHA, run_id):
                won.append(run_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claim, args=(f"run-{n}:0",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert errors == [] and len(won) == 1, (won, errors)
    row = memory_ledger.get(ALPHA)
    assert row is not None and row.run_id == won[0] and row.status is StepStatus.RUNNING


class _Outage(MemoryStorage):
    """The shared storage down: every read is ``storage.unavailable`` (the retries spent)."""

    def get(self, key: str) -> bytes:
        raise PipelineError(ErrorCode.STORAGE_UNAVAILABLE, f"storage {self.url}: down ({key})")


def test_a_storage_outage_is_never_judged_as_drift(
    tmp_path: Path, memory_ledger: LedgerStore
) -> None:
    """A published checkpoint judged by a new process while the storage is down: the outage
    is raised as what it is (``storage.unavailable``: the run fails, the sensor's tick tries
    again), never classified as the checkpoint's contract drift, a block only a force lifts."""
    storage = MemoryStorage(tmp_path.name)
    first = next(machines(tmp_path / "one", memory_ledger, storage))
    first.run("alpha")
    down = _Outage(tmp_path.name)
    down._objects = storage._objects  # the same bucket, unreachable
    second = next(machines(tmp_path / "two", memory_ledger, down))
    with pytest.raises(PipelineError) as outage:
        second.judge("alpha")
    assert outage.value.code == ErrorCode.STORAGE_UNAVAILABLE
