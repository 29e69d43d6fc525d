"""The sensor's batch evaluator (Dagster-free): same judge, launch rules, zero writes.

An exhaustive grid of prior states of ``src`` (ledger status, recovery count, backoff and
checkpoint state), each in its own partition, is evaluated in one call and compared with
``StepJudge.judge`` called directly, the way a run calls it.
"""

import itertools
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sensor_steps import (
    SENSOR_STEPS,
    Src,
    delete_row,
    runtime,
    seed,
    set_row,
    snapshot,
    step_judge,
    stores_for,
    write_input,
)

from pipeline_defs.judging.evaluation import BatchJudge, evaluate_partitions
from pipeline_defs.judging.step_evaluation import LAUNCH_ACTIONS, StepEvaluation, Verdict
from pipeline_defs.judging.stores import Stores
from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.decision_types import LaunchMode, ResumeAction
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.runner import RunInfo, StepRunner
from resources.checkpoints.published import published_checkpoints
from resources.pipeline import LedgerPointers
from resources.storage import ObjectMeta
from resources.testing import MemoryStorage

NOW = datetime.now(UTC).replace(microsecond=0)
ROWS = (
    "none",
    "completed",
    "failed",
    "partial",
    "stale",
    "pending",
    "running_healthy",
    "running_stale",
    "running_null",
    "running_garbage",
)
RECOVERIES = (0, 3)
BACKOFF = (None, "future", "past")
BACKOFF_ROWS = ("failed", "partial", "running_stale", "completed")
CHECKPOINTS = ("present", "absent", "artifact_missing", "corrupt")
# One prior state of src: (row, recovery count, backoff, checkpoint).
Case = tuple[str, int, str | None, str]
# The grid's stores, and the case each of its partitions holds.
Grid = tuple[Stores, dict[str, Case]]


def _apply(
    stores: Stores, pk: str, row: str, recoveries: int, backoff: str | None, cp: str
) -> None:
    key = Episode.parse(pk).step("src")
    if row != "none" or cp != "absent":
        seed(stores, pk, "src")
    ledger = stores.ledger
    if row == "none" and cp != "absent":
        delete_row(stores, key)  # an orphan checkpoint: no ledger row
    elif row in ("failed", "partial"):
        assert ledger.claim(key, "r-x:0")
        assert ledger.transition(key, "r-x:0", row)
    elif row == "stale":
        assert ledger.invalidate([key], "test") == [key]
    elif row == "pending":
        set_row(stores, key, status="pending")
    elif row.startswith("running"):
        started = NOW - (timedelta(hours=2) if row == "running_stale" else timedelta(seconds=10))
        assert ledger.claim(key, "r-run:0", now=format_timestamp(started))
        if row == "running_null":
            set_row(stores, key, started_at=None)
        elif row == "running_garbage":
            set_row(stores, key, started_at="garbage")
    if row != "none":
        retry = {
            None: None,
            "future": format_timestamp(NOW + timedelta(minutes=5)),
            "past": format_timestamp(NOW - timedelta(minutes=5)),
        }[backoff]
        set_row(
            stores,
            key,
            recovery_count=recoveries,
            last_recovery_reason="earlier" if recoveries else None,
            retry_not_before=retry,
        )
    path = stores.checkpoints.path_for(key)
    if cp == "absent" and path.exists():
        path.unlink()
    elif cp == "artifact_missing":
        (path.parent / "out.bin").unlink()
    elif cp == "corrupt":
        path.write_text('{"step_id": "src", "truncated')


def _grid() -> Iterator[tuple[str, Case]]:
    for n, (row, rc, backoff, cp) in enumerate(
        itertools.product(ROWS, RECOVERIES, BACKOFF, CHECKPOINTS)
    ):
        if row == "none" and (rc or backoff):
            continue  # no row: nothing to count or defer
        if backoff and row not in BACKOFF_ROWS:
            continue  # backoff only matters for automatic recoveries
        yield f"grid/g{n:03d}", (row, rc, backoff, cp)


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> Grid:
    home = tmp_path_factory.mktemp("grid")
    stores = stores_for(home, f"sqlite:///{home / 'ledger.sqlite3'}", running_timeout_seconds=3600)
    cases = dict(_grid())
    for pk, case in cases.items():
        _apply(stores, pk, *case)
    return stores, cases


def test_grid_decisions_equal_the_judge_a_run_calls(grid: Grid) -> None:
    stores, cases = grid
    before = snapshot(stores)
    evaluations = evaluate_partitions(SENSOR_STEPS, stores, list(cases), NOW)
    assert snapshot(stores) == before, "evaluation wrote something"
    assert len(evaluations) == len(cases) * len(SENSOR_STEPS)
    rows = stores.ledger.get_many()
    for ev in evaluations:
        key = Episode.parse(ev.partition_key).step(ev.step_id)
        direct = step_judge(stores, ev.step_id).judge(
            key, mode=LaunchMode.RESUME, row=rows.get(key), now=NOW
        )
        assert ev.decision == direct.decision, (ev.partition_key, ev.step_id)


def test_grid_never_forces_and_launches_only_what_the_rules_allow(grid: Grid) -> None:
    stores, cases = grid
    evaluations = evaluate_partitions(SENSOR_STEPS, stores, list(cases), NOW)
    by = {(ev.partition_key, ev.step_id): ev for ev in evaluations}
    for ev in evaluations:
        action = ev.decision.action
        assert action is not ResumeAction.FORCE_EXPLICIT
        expected = {
            ResumeAction.SKIP: {Verdict.SKIP},
            ResumeAction.NOT_APPLICABLE: {Verdict.NOT_APPLICABLE},
            ResumeAction.BLOCK: {Verdict.BLOCKED, Verdict.RUNNING},
        }.get(action, {Verdict.LAUNCH, Verdict.DEFERRED, Verdict.WAITING})
        assert ev.verdict in expected
        assert (ev.run_key is not None) == (action in LAUNCH_ACTIONS)
        if ev.launch:
            assert action in LAUNCH_ACTIONS and ev.decision.deferred_until is None
            assert not ev.waits_on
            # Whatever it runs after is in the same run (launched, same run key).
            for u in ev.after:
                upstream = by[(ev.partition_key, u)]
                assert upstream.launch and upstream.run_key == ev.run_key
        if ev.verdict is Verdict.DEFERRED:
            assert ev.decision.deferred_until is not None
        if ev.verdict is Verdict.BLOCKED:
            assert ev.block_signature and ev.what_to_do
        json.dumps(ev.as_dict())
        # Dependency order: a launchable step waits while an upstream is unsettled and not
        # in the partition's run; it joins the run of an upstream that is launched.
        if ev.step_id != "src" and action in LAUNCH_ACTIONS:
            src = by[(ev.partition_key, "src")]
            if src.verdict is Verdict.LAUNCH:
                assert ev.verdict is Verdict.LAUNCH and "src" in ev.after
            elif src.verdict is not Verdict.SKIP:
                assert ev.verdict is Verdict.WAITING and "src" in ev.waits_on
        if ev.step_id == "end" and action in LAUNCH_ACTIONS:
            assert ev.waits_on in ((), ("src", "mid"), ("mid",))
        # One run per partition: every launch of a partition has the same run key.
        launches = [by[(ev.partition_key, s)] for s in ("src", "mid", "end", "side")]
        assert len({e.run_key for e in launches if e.launch}) <= 1, ev.partition_key


def _src(grid: Grid, row: str, rc: int, backoff: str | None, cp: str) -> dict[str, StepEvaluation]:
    stores, cases = grid
    pk = next(k for k, case in cases.items() if case == (row, rc, backoff, cp))
    evs = evaluate_partitions(SENSOR_STEPS, stores, [pk], NOW)
    return {ev.step_id: ev for ev in evs}


@pytest.mark.parametrize(
    ("case", "action", "verdict", "code"),
    [
        (("none", 0, None, "absent"), "rerun_self", "launch", None),
        (("none", 0, None, "present"), "skip", "skip", None),  # adopted by the run
        (("none", 0, None, "corrupt"), "block", "blocked", "step.resume_blocked"),
        (("completed", 0, None, "present"), "skip", "skip", None),
        (("completed", 3, None, "present"), "skip", "skip", None),
        (("completed", 0, None, "absent"), "rerun_self", "launch", None),
        (("completed", 0, None, "artifact_missing"), "rerun_self", "launch", None),
        (("completed", 3, None, "artifact_missing"), "block", "blocked", "step.recovery_exhausted"),
        (("completed", 0, None, "corrupt"), "block", "blocked", "step.resume_blocked"),
        (("failed", 0, None, "present"), "rerun_self", "launch", None),
        (("failed", 0, "future", "present"), "rerun_self", "deferred", None),
        (("failed", 0, "past", "present"), "rerun_self", "launch", None),
        (("failed", 3, None, "present"), "block", "blocked", "step.recovery_exhausted"),
        (("failed", 3, "future", "present"), "block", "blocked", "step.recovery_exhausted"),
        (("partial", 0, None, "present"), "rerun_self", "launch", None),
        (("stale", 0, None, "present"), "rerun_self", "launch", None),
        (("pending", 0, None, "absent"), "rerun_self", "launch", None),
        (("running_healthy", 0, None, "present"), "block", "running", "step.already_running"),
        (("running_stale", 0, None, "present"), "stale_running_recovery", "launch", None),
        (("running_stale", 0, "future", "present"), "stale_running_recovery", "deferred", None),
        (("running_stale", 3, None, "present"), "block", "blocked", "step.recovery_exhausted"),
        (("running_null", 0, None, "present"), "block", "blocked", "step.resume_blocked"),
        (("running_garbage", 0, None, "present"), "block", "blocked", "step.resume_blocked"),
    ],
)
def test_grid_rows(grid: Grid, case: Case, action: str, verdict: str, code: str | None) -> None:
    evs = _src(grid, *case)
    src = evs["src"]
    assert (src.decision.action.value, src.verdict.value, src.decision.code) == (
        action,
        verdict,
        code,
    ), src.decision.reason
    for downstream in ("mid", "end", "side"):  # never run in the grid: first runs
        ev = evs[downstream]
        assert ev.decision.action is ResumeAction.RERUN_SELF
        # In the run of src (or after a settled src); behind a deferred or blocked src, waits.
        assert ev.verdict is (Verdict.LAUNCH if verdict in ("skip", "launch") else Verdict.WAITING)


def test_what_to_do_names_the_right_remedy(grid: Grid) -> None:
    healthy = _src(grid, "running_healthy", 0, None, "present")["src"]
    # A live lease: no reset hint, which would invite resetting a live run.
    assert "run 'r-run:0' is working on it" in healthy.what_to_do
    assert "reset-running" not in healthy.what_to_do and healthy.running_healthy
    null = _src(grid, "running_null", 0, None, "present")["src"]
    assert "manual investigation required" in null.what_to_do
    assert "--null-started-at" in null.what_to_do
    exhausted = _src(grid, "failed", 3, None, "present")["src"]
    assert "resume/mode=force" in exhausted.what_to_do
    corrupt = _src(grid, "completed", 0, None, "corrupt")["src"]
    assert corrupt.decision.origin and corrupt.decision.origin.value == "contract_drift"
    assert "resume/mode=force" in corrupt.what_to_do


# --------------------------------------------------------------------------- run keys
def test_run_key_is_stable_for_a_state_and_changes_with_it(
    db_url: str, pipeline_home: Path
) -> None:
    stores = stores_for(pipeline_home, db_url)
    seed(stores, "p/e1")
    key = StepKey("p", "e1", "src")
    assert stores.ledger.claim(key, "r1:0")
    assert stores.ledger.transition(key, "r1:0", "failed")

    def src_key() -> str | None:
        evs = evaluate_partitions(SENSOR_STEPS, stores, ["p/e1"], NOW)
        return next(ev for ev in evs if ev.step_id == "src").run_key

    first = src_key()
    assert first is not None and first.startswith("resume:src:p/e1:")
    assert src_key() == first  # same state → same key (Dagster launches it once)
    assert stores.ledger.claim(key, "r2:0", auto_recovery=True, reason="auto")
    assert stores.ledger.transition(key, "r2:0", "failed")
    second = src_key()
    assert second not in (None, first)  # a new failure is a new state
    (stores.checkpoints.step_dir(key) / "out.bin").unlink()
    assert src_key() not in (None, first, second)  # so is a change on disk


def test_a_downstream_run_key_follows_its_upstream_state(
    sqlite_url: str, pipeline_home: Path
) -> None:
    """A launch that died before claiming (its upstream moved) is relaunched once settled."""
    stores = stores_for(pipeline_home, sqlite_url)
    seed(stores, "p/e1")
    (stores.checkpoints.step_dir(StepKey("p", "e1", "end")) / "out.bin").unlink()

    def end_key() -> str | None:
        evs = evaluate_partitions(SENSOR_STEPS, stores, ["p/e1"], NOW)
        return next(ev for ev in evs if ev.step_id == "end").run_key

    first = end_key()
    assert first is not None and end_key() == first
    mid = StepKey("p", "e1", "mid")  # mid re-ran meanwhile (and is clean again)
    assert stores.ledger.claim(mid, "again:0")
    assert stores.ledger.transition(mid, "again:0", "completed")
    assert end_key() not in (None, first)


def test_upstream_running_or_blocked_makes_downstream_wait(
    db_url: str, pipeline_home: Path
) -> None:
    stores = stores_for(pipeline_home, db_url)
    seed(stores, "p/e1")
    seed(stores, "p/e2")
    for pk in ("p/e1", "p/e2"):  # every downstream step has lost its artifact
        for step_id in ("mid", "end", "side"):
            step_dir = stores.checkpoints.step_dir(Episode.parse(pk).step(step_id))
            next(p for p in step_dir.rglob("*") if p.name in ("out.bin", "f0.png")).unlink()
    assert stores.ledger.claim(StepKey("p", "e1", "src"), "busy:0")  # src running
    write_input(pipeline_home, "p/e2", "verify.json", {"mid": "drift"})  # mid blocked
    # Judged now (not at the module's NOW): the claim's lease starts now, and one started
    # after the judge's clock would be a lease from the future (a block to investigate).
    evs = {
        (e.partition_key, e.step_id): e
        for e in evaluate_partitions(SENSOR_STEPS, stores, ["p/e1", "p/e2"], datetime.now(UTC))
    }
    assert evs[("p/e1", "src")].verdict is Verdict.RUNNING  # held by a live run: no block
    for step_id in ("mid", "end", "side"):
        ev = evs[("p/e1", step_id)]
        assert ev.decision.action is ResumeAction.RERUN_SELF
        assert ev.verdict is Verdict.WAITING and "src" in ev.waits_on
    assert evs[("p/e2", "mid")].verdict is Verdict.BLOCKED
    assert evs[("p/e2", "end")].verdict is Verdict.WAITING
    assert evs[("p/e2", "end")].waits_on == ("mid",)
    assert evs[("p/e2", "side")].verdict is Verdict.LAUNCH


def test_unjudgeable_partitions_are_blocks_not_crashes(
    sqlite_url: str, pipeline_home: Path
) -> None:
    stores = stores_for(pipeline_home, sqlite_url)
    bad_config = pipeline_home / "projects" / "q" / "project.yaml"
    bad_config.parent.mkdir(parents=True)
    bad_config.write_text("no_such_key: 1\n")
    evs = evaluate_partitions(SENSOR_STEPS, stores, ["not a key", "q/e1", "p/e1"], NOW)
    verdicts = {(e.partition_key, e.step_id): e for e in evs}
    for step in SENSOR_STEPS:
        for pk in ("not a key", "q/e1"):
            ev = verdicts[(pk, step.step_id)]
            assert ev.verdict is Verdict.BLOCKED
            assert ev.decision.reason.startswith("cannot be judged")
    assert verdicts[("q/e1", "src")].decision.reason.startswith("cannot be judged: config.invalid")
    assert verdicts[("p/e1", "src")].verdict is Verdict.LAUNCH


class _Down(MemoryStorage):
    """The shared storage out of reach: every read is ``storage.unavailable`` (the error an
    object store raises once its retries are spent)."""

    def _down(self, key: str) -> PipelineError:
        return PipelineError(ErrorCode.STORAGE_UNAVAILABLE, f"storage {self.url}: down ({key})")

    def get(self, key: str) -> bytes:
        raise self._down(key)

    def head(self, key: str) -> ObjectMeta | None:
        raise self._down(key)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        raise self._down(prefix)


def test_an_outage_is_no_block_the_batch_judge_defers_it_and_a_view_raises_it(
    sqlite_url: str, pipeline_home: Path, tmp_path: Path
) -> None:
    """A published checkpoint judged while the storage is down: the outage says nothing of
    it, so it is no block (contract drift, lifted only by a force). The sensor's batch judge
    leaves the partition out and names it in ``outages`` (the tick defers it); the views'
    ``evaluate_partitions`` (``status``, ``decide``) raise it as it is."""
    stores = stores_for(pipeline_home, sqlite_url)
    storage = MemoryStorage(tmp_path.name)
    worker = published_checkpoints(tmp_path / "worker", storage, LedgerPointers(stores.ledger))
    seed(Stores(stores.settings, stores.ledger, worker), "p/e1", "src")
    down = _Down(tmp_path.name)
    down._objects = storage._objects  # the same bucket, unreachable
    sensor = Stores(
        stores.settings,
        stores.ledger,
        published_checkpoints(tmp_path / "sensor", down, LedgerPointers(stores.ledger)),
    )
    judge = BatchJudge(SENSOR_STEPS, sensor)
    assert judge.evaluate(["p/e1"], NOW, judge.load_rows(["p/e1"])) == []
    (outage,) = judge.outages.values()
    assert list(judge.outages) == ["p/e1"] and outage.code == ErrorCode.STORAGE_UNAVAILABLE
    with pytest.raises(PipelineError) as raised:
        evaluate_partitions(SENSOR_STEPS, sensor, ["p/e1"], NOW)
    assert raised.value.code == ErrorCode.STORAGE_UNAVAILABLE


def test_not_applicable_is_never_launched(sqlite_url: str, pipeline_home: Path) -> None:
    stores = stores_for(pipeline_home, sqlite_url)
    seed(stores, "p/e1", "src")
    write_input(pipeline_home, "p/e1", "no_side", "")
    side = next(
        ev
        for ev in evaluate_partitions(SENSOR_STEPS, stores, ["p/e1"], NOW)
        if ev.step_id == "side"
    )
    assert side.decision.action is ResumeAction.NOT_APPLICABLE
    assert side.verdict is Verdict.NOT_APPLICABLE and not side.launch and side.run_key is None


# --------------------------------------------------------------------------- one run per partition
def _runs(evaluations: list[StepEvaluation]) -> dict[str, list[str]]:
    """Partition → the steps launched (dependency order); they must share one run key."""
    runs: dict[str, list[StepEvaluation]] = {}
    for ev in evaluations:
        if ev.launch:
            runs.setdefault(ev.partition_key, []).append(ev)
    for pk, evs in runs.items():
        assert len({ev.run_key for ev in evs}) == 1, f"{pk}: more than one run"
    return {pk: [ev.step_id for ev in evs] for pk, evs in runs.items()}


def test_a_run_never_holds_a_step_settled_on_its_own(sqlite_url: str, pipeline_home: Path) -> None:
    """docs/DESIGN.md#sensor: a force staled mid, end and side; side was re-run by hand since
    (clean again). When src itself needs work, its run takes the stale steps below it and
    leaves side out: a clean checkpoint is never re-run for its upstream's sake."""
    stores = stores_for(pipeline_home, sqlite_url)
    seed(stores, "p/e1")
    runtime(stores, "src").run("p/e1", RunInfo("force-src:0", LaunchMode.FORCE, "test"), {})
    assert {ev.step_id for ev in _evaluate(stores, "p/e1") if ev.launch} == {"mid", "end", "side"}
    seed(stores, "p/e1", "side", run_id="by-hand")
    (stores.checkpoints.step_dir(StepKey("p", "e1", "src")) / "out.bin").unlink()
    evs = {ev.step_id: ev for ev in _evaluate(stores, "p/e1")}
    assert _runs(list(evs.values())) == {"p/e1": ["src", "mid", "end"]}
    assert evs["side"].verdict is Verdict.SKIP  # judged on its own: clean
    assert evs["mid"].after == ("src",) and evs["end"].after == ("src", "mid")
    assert evs["mid"].decision.reason == "auto recovery: invalidated by an explicit force upstream"
    assert evs["src"].run_key == f"resume:src+2:p/e1:{evs['src'].run_state}"


def test_a_blocked_step_keeps_its_downstream_out_of_the_run(
    sqlite_url: str, pipeline_home: Path
) -> None:
    """mid is blocked (its verifier reports drift): it is reported, never launched, and end
    below it waits; side, below the re-run src only, goes in src's run."""
    stores = stores_for(pipeline_home, sqlite_url)
    seed(stores, "p/e1")
    write_input(pipeline_home, "p/e1", "verify.json", {"mid": "drift"})
    for step_id, name in (("src", "out.bin"), ("end", "out.bin"), ("side", "out.bin")):
        (stores.checkpoints.step_dir(StepKey("p", "e1", step_id)) / name).unlink()
    evs = {ev.step_id: ev for ev in _evaluate(stores, "p/e1")}
    assert _runs(list(evs.values())) == {"p/e1": ["src", "side"]}
    assert evs["mid"].verdict is Verdict.BLOCKED and evs["mid"].run_key is None
    assert evs["end"].decision.action is ResumeAction.RERUN_SELF  # needs work itself, but
    assert evs["end"].verdict is Verdict.WAITING and "mid" in evs["end"].waits_on
    assert evs["end"].detail == "waits on blocked upstream mid" and not evs["end"].launch


def test_a_deferred_step_keeps_its_downstream_out_of_the_run(
    sqlite_url: str, pipeline_home: Path
) -> None:
    """A backoff (row 13) holds the step and what waits on it; nothing is launched early."""
    stores = stores_for(pipeline_home, sqlite_url)
    seed(stores, "p/e1")
    key = StepKey("p", "e1", "mid")
    assert stores.ledger.claim(key, "r1:0") and stores.ledger.transition(key, "r1:0", "failed")
    retry = format_timestamp(NOW + timedelta(minutes=5))
    set_row(stores, key, retry_not_before=retry)
    (stores.checkpoints.step_dir(StepKey("p", "e1", "end")) / "out.bin").unlink()
    evs = {ev.step_id: ev for ev in _evaluate(stores, "p/e1")}
    assert _runs(list(evs.values())) == {}
    assert evs["mid"].verdict is Verdict.DEFERRED
    assert evs["end"].verdict is Verdict.WAITING and evs["end"].waits_on == ("mid",)
    later = evaluate_partitions(SENSOR_STEPS, stores, ["p/e1"], NOW + timedelta(minutes=6))
    assert _runs(later) == {"p/e1": ["mid", "end"]}


class _Tail(Src):
    """A step below ``side``: its gate needs side's record, even a not-applicable one."""

    step_id = "tail"
    deps = ("side",)


def test_a_not_applicable_step_is_recorded_by_the_run_that_needs_it(
    sqlite_url: str, pipeline_home: Path
) -> None:
    """side is not applicable and has no record yet: nothing needs it but tail, whose gate
    does. It goes in the run with tail (the run records it, no claim, no call); before,
    tail waited for a record no launch would ever write."""
    steps = (*SENSOR_STEPS, _Tail())
    stores = stores_for(pipeline_home, sqlite_url)
    write_input(pipeline_home, "p/e1", "no_side", "")
    write_input(pipeline_home, "p/e2", "no_side", "")
    seed(stores, "p/e2")  # p/e2: src and the rest ran (side recorded as not applicable)
    evs = evaluate_partitions(steps, stores, ["p/e1", "p/e2"], NOW)
    assert _runs(evs) == {"p/e1": ["src", "mid", "end", "side", "tail"], "p/e2": ["tail"]}
    graph = StepGraph(steps)
    for step in graph.ordered:  # run p/e1's run, step by step, as Dagster would
        judge = StepJudge(
            step,
            graph=graph,
            settings=stores.settings,
            ledger=stores.ledger,
            checkpoints=stores.checkpoints,
        )
        inputs = {d: stores.checkpoints.load(Episode.parse("p/e1").step(d)) for d in step.deps}
        runner = StepRunner(judge, ledger=stores.ledger, checkpoints=stores.checkpoints)
        runner.run("p/e1", RunInfo("the-run:0", launch_path="test"), inputs)
    rows = stores.ledger.get_many(episodes=[Episode.parse("p/e1")])
    assert {k.step_id: str(r.status) for k, r in rows.items()} == {
        "src": "completed",
        "mid": "completed",
        "end": "completed",
        "side": "not_applicable",
        "tail": "completed",
    }
    assert _runs(evaluate_partitions(steps, stores, ["p/e1"], NOW)) == {}
    side = next(
        e for e in evaluate_partitions(SENSOR_STEPS, stores, ["p/e3"], NOW) if e.step_id == "side"
    )
    assert side.verdict is Verdict.LAUNCH  # p/e3 is applicable: a first run like any other


def _evaluate(stores: Stores, pk: str) -> list[StepEvaluation]:
    return evaluate_partitions(SENSOR_STEPS, stores, [pk], NOW)
