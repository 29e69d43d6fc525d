"""A claim is owned by its delivery (docs/DESIGN.md#claim-tokens).

The fencing token is minted per claim, not per run: a task delivered again in the same run
(the broker's redelivery of an unacknowledged task), a retry, a re-execution each claim with
a token of their own. Before, the token was ``<run id>:<retry>``: a redelivery that took a
paused worker's row over carried the same token, so the resumed worker's lease, its call
records and its publish all still matched, and it paid twice and wrote a second ``finish``.

- two deliveries of one run in one process: the first holds its claim and waits in a model
  call; its lease lapses; the second takes the row over, pays and publishes; the first,
  released, makes no further call, writes nothing, fails ``step.ownership_lost``;
- each provider call is recorded only while its claim holds the row (in the recording
  transaction, under the row's lock);
- ``Lease.check`` asks the ledger itself when its renewal thread is behind (a process
  resumed after a pause): switched off, a taken-over claim would pass the check.
"""

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from sensor_steps import set_row, stores_for

from pipeline_defs.judging.stores import Stores
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.lease import Lease
from pipeline_defs.steps.runner import RunInfo, StepOutcome, StepRunner
from pipeline_defs.steps.runner.run_info import claim_token
from pipeline_defs.steps.spec import Step, StepResult
from resources.checkpoints.envelope import Checkpoint
from resources.ledger.store import LedgerStore
from resources.providers import TextCall, TextReply

PARTITION = "p/e1"
KEY = StepKey("p", "e1", "paid")
LONG_AGO = "2020-01-01T00:00:00.000000Z"
CALLS = 3
FIRST = "delivery-1"
SECOND = "delivery-2"


class Paid(Step):
    """Three paid text calls; its data names the delivery that made them."""

    step_id = "paid"

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        words = [
            ctx.providers.text(TextCall(task="paid", prompt=f"line {n}", payload={})).data["by"]
            for n in range(CALLS)
        ]
        return StepResult(data={"by": words}, applicable_count=len(words))


class GatedModel:
    """A text model (the ``Model`` protocol) whose first call from the first delivery waits
    until the test releases it: the call in flight while the worker is paused."""

    model_name = "gated-v1"

    def __init__(self) -> None:
        self.in_flight = threading.Event()
        self.release = threading.Event()
        self.answered: list[str] = []

    def for_provider(self, provider: Any) -> "GatedModel":
        return self

    def preflight(self) -> None:
        pass

    def complete(self, call: TextCall) -> TextReply:
        who = threading.current_thread().name
        if who == FIRST and not self.in_flight.is_set():
            self.in_flight.set()
            assert self.release.wait(60), "the test never released the call in flight"
        self.answered.append(who)
        return TextReply(data={"by": who}, units=1, model=self.model_name)


def _runner(home: Path, db_url: str, model: GatedModel) -> tuple[StepRunner, Stores]:
    # A heartbeat far longer than the test: the first delivery's lease thread never renews
    # on its own, as a paused worker's does not; its check must ask the ledger.
    stores = stores_for(home, db_url, heartbeat_seconds=3600, lease_seconds=7200)
    graph = StepGraph([Paid()])
    judge = StepJudge(
        graph.step("paid"),
        graph=graph,
        settings=stores.settings,
        ledger=stores.ledger,
        checkpoints=stores.checkpoints,
    )
    runner = StepRunner(
        judge, ledger=stores.ledger, checkpoints=stores.checkpoints, models={"text": model}
    )
    return runner, stores


RUN = "2f0c6c0e-0000-4000-8000-000000000001:0"
OTHER_RUN = "7d1e5a3b-0000-4000-8000-000000000002:0"


@pytest.mark.parametrize("taker", ["redelivery", "another run"])
def test_a_paused_delivery_whose_claim_was_taken_over_pays_and_writes_nothing(
    db_url: str, tmp_path: Path, taker: str
) -> None:
    """The row is taken over by a redelivery of the same task (same run, same retry) or by
    another run. Either way the paused delivery, released, makes no call and no ledger
    write. Fenced out by its own redelivery it reports the step's published checkpoint as a
    SKIP (the run goes on with it); by another run, ``step.ownership_lost``."""
    home = tmp_path / "home"
    home.mkdir()
    model = GatedModel()
    runner, stores = _runner(home, db_url, model)
    ledger = runner.ledger
    run = RunInfo(RUN, launch_path="test")
    rival = run if taker == "redelivery" else RunInfo(OTHER_RUN, launch_path="test")
    ended: dict[str, BaseException | StepOutcome] = {}

    def deliver() -> None:
        try:
            ended["first"] = runner.run(PARTITION, run, {})
        except BaseException as exc:
            ended["first"] = exc

    first = threading.Thread(target=deliver, name=FIRST, daemon=True)
    first.start()
    assert model.in_flight.wait(60), ended
    held = ledger.get(KEY)
    assert held is not None and held.status is StepStatus.RUNNING
    assert held.run_id is not None and held.run_id.startswith(run.run_id)
    # The first delivery is paused past its lease: its heartbeat is long gone.
    set_row(stores, KEY, heartbeat_at=LONG_AGO)
    calls_at_pause = len(ledger.provider_calls())

    second: dict[str, StepOutcome] = {}
    redelivered = threading.Thread(
        target=lambda: second.update(done=runner.run(PARTITION, rival, {})),
        name=SECOND,
        daemon=True,
    )
    redelivered.start()
    redelivered.join(60)
    if "done" not in second:
        model.release.set()
    outcome = second["done"]
    assert outcome.status.value == "completed", outcome
    row = ledger.get(KEY)
    assert row is not None and row.status is StepStatus.COMPLETED
    history = ledger.transitions(KEY)
    writes_before_release = len(history)
    calls_before_release = len(ledger.provider_calls())
    assert calls_before_release == calls_at_pause + CALLS

    model.release.set()  # the paused worker resumes: its call in flight comes back
    first.join(60)
    ending = ended["first"]
    if taker == "redelivery":
        assert isinstance(ending, StepOutcome), ending
        assert ending.status.value == "skip" and ending.provider_calls == 0
        assert ending.checkpoint is not None and ending.checkpoint.data["by"] == [SECOND] * CALLS
    else:
        assert isinstance(ending, PipelineError), ending
        assert ending.code == ErrorCode.STEP_OWNERSHIP_LOST
    assert model.answered.count(FIRST) == 1, "only the call in flight at the pause"
    assert len(ledger.provider_calls()) == calls_before_release, "the resumed worker paid"
    assert len(ledger.transitions(KEY)) == writes_before_release, ledger.transitions(KEY)
    assert [t.action for t in history].count("finish") == 1
    after = ledger.get(KEY)
    assert after is not None and (after.run_id, after.status) == (row.run_id, row.status)
    checkpoint = runner.checkpoints.load(KEY)
    assert checkpoint is not None and checkpoint.data["by"] == [SECOND] * CALLS
    assert row.run_id != held.run_id, "the redelivery claimed with the paused claim's token"


def test_each_claim_mints_a_token_of_its_own() -> None:
    run = "2f0c6c0e-0000-4000-8000-000000000001:0"
    tokens = {claim_token(run) for _ in range(100)}
    assert len(tokens) == 100
    assert all(t.startswith(f"{run}:") and len(t) <= 128 for t in tokens)
    claimed = RunInfo(run).claiming()
    assert claimed.run_id.startswith(f"{run}:") and claimed.run_id != run


def test_a_call_is_recorded_only_under_the_claim_that_holds_the_row(store: LedgerStore) -> None:
    mine, thief = claim_token("run-a:0"), claim_token("run-a:0")  # one run, two deliveries
    assert store.claim(KEY, mine)
    first = store.start_provider_call(KEY, mine, kind="text", claimed=True)
    assert store.claim(KEY, thief, allow_stale_steal=True, **_as_seen(store))
    with pytest.raises(PipelineError) as refused:
        store.start_provider_call(KEY, mine, kind="text", claimed=True, cap=10)
    assert refused.value.code == ErrorCode.STEP_OWNERSHIP_LOST
    assert [c["id"] for c in store.provider_calls()] == [first], "nothing recorded or counted"
    assert store.start_provider_call(KEY, thief, kind="text", claimed=True, cap=2)
    with pytest.raises(PipelineError) as capped:  # the refused call took no share of the cap
        store.start_provider_call(KEY, thief, kind="text", claimed=True, cap=2)
    assert capped.value.code == ErrorCode.BUDGET_EXHAUSTED
    assert store.transition(KEY, thief, "completed")
    with pytest.raises(PipelineError):  # a settled row holds no claim either
        store.start_provider_call(KEY, thief, kind="text", claimed=True)


def _as_seen(store: LedgerStore) -> dict[str, Any]:
    row = store.get(KEY)
    assert row is not None
    return {"expected_started_at": row.started_at, "expected_run_id": row.run_id}


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_lease_check_asks_the_ledger_when_its_thread_is_behind(store: LedgerStore) -> None:
    """The probe of ``Lease.check``: a process resumed after a pause past its lease, its
    renewal thread not yet run, must not trust its last renewal. The thread is never
    started here (as if still asleep); the clock says two intervals passed."""
    mine, thief = claim_token("run-a:0"), claim_token("run-a:0")
    assert store.claim(KEY, mine)
    clock = _Clock()
    log = logging.getLogger(__name__)
    lease = Lease(store, KEY, mine, interval_seconds=10, log=log, clock=clock)
    lease.check()  # fresh: no question asked, nothing lost
    assert store.claim(KEY, thief, allow_stale_steal=True, **_as_seen(store))
    clock.now += 15  # within two intervals: the thread is not known to be behind yet
    lease.check()
    clock.now += 10  # past two intervals: the row is asked now
    with pytest.raises(PipelineError) as lost:
        lease.check()
    assert lost.value.code == ErrorCode.STEP_OWNERSHIP_LOST and lease.lost
    row = store.get(KEY)
    assert row is not None and row.run_id == thief  # the probe wrote nothing
