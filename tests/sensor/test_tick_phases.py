"""The tick's phases one by one: plan → judge → memoise → block diff → next cursor.

Plan and judge run against a real SQLite ledger and checkpoint tree (seeded through the
run protocol); memoise and block diff are pure and take stand-in evaluations (they read
only the evaluation fields named below); the cursor is checked against the format that
running sensors have stored since ``CURSOR_VERSION`` 1.
"""

import base64
import json
import zlib
from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from sensor_steps import SENSOR_STEPS, seed, stores_for

from pipeline_defs.judging.blocks import block_diff
from pipeline_defs.judging.cursor import CursorState
from pipeline_defs.judging.memo import memoise
from pipeline_defs.judging.plan import hold_back, hold_for_backfills
from pipeline_defs.judging.scan import PartitionScan
from pipeline_defs.judging.step_evaluation import StepEvaluation, Verdict
from pipeline_defs.judging.tick import ResumeTicker
from pipeline_defs.judging.tick_result import TickConfig, TickStats
from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.decision_types import ResumeAction, ResumeDecision
from pipeline_defs.resume.identity import ABSENT
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow
from resources.ledger.store import LedgerStore

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)

# A cursor exactly as ``encode_cursor`` wrote it before CursorState existed (0553b6f).
OLD_CURSOR = (
    '{"blocked":{"mid|p/e1":"0f3a"},"full_at":1767268800.5,"ledger":[42,"2026-01-01T12:00:00Z"],'
    '"parts":"aa","pending":0,"scope":"s1","subdirs":{"mid":["frames"]},"token":"t1",'
    '"tree":"bb","v":1,"wake":null}'
)


# ----------------------------------------------------------------------------- cursor
def test_an_old_format_cursor_loads_and_round_trips() -> None:
    state = CursorState.decode(OLD_CURSOR)
    assert state == CursorState(
        scope="s1",
        token="t1",
        ledger=(42, "2026-01-01T12:00:00Z"),
        parts="aa",
        tree="bb",
        wake=None,
        full_at=1767268800.5,
        subdirs={"mid": ("frames",)},
        blocked={"mid|p/e1": "0f3a"},
        pending=0,
    )
    assert state.encode() == OLD_CURSOR  # byte for byte: the stored cursor stays valid


def test_an_old_compressed_cursor_loads() -> None:
    blocked = {f"mid|p/e{n}": f"{n:032x}" for n in range(200)}  # past the 2 KiB threshold
    raw = json.loads(OLD_CURSOR) | {"blocked": blocked}
    text = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    old = "z1:" + base64.b64encode(zlib.compress(text.encode("utf-8"), 6)).decode("ascii")
    state = CursorState.decode(old)
    assert state is not None and state.blocked == blocked and state.ledger == (42, raw["ledger"][1])
    assert state.encode() == old


def test_unusable_cursors_read_as_none_or_absent_fields() -> None:
    assert CursorState.decode(None) is None
    assert CursorState.decode("") is None
    assert CursorState.decode("not json") is None
    assert CursorState.decode("z1:!!!") is None
    assert CursorState.decode('{"v":2}') is None  # another version
    assert CursorState.decode("[1]") is None
    odd = CursorState.decode('{"v":1,"ledger":[1],"full_at":"x","subdirs":[],"pending":"2"}')
    assert odd == CursorState()  # wrong shapes read as absent: the tick judges everything


def test_rescoped_keeps_only_the_blocks() -> None:
    state = CursorState.decode(OLD_CURSOR)
    assert state is not None
    assert state.rescoped() == CursorState(blocked={"mid|p/e1": "0f3a"})


# ----------------------------------------------------------------------------- scan
def test_partition_scan_owns_the_offsets(tmp_path: Path) -> None:
    shape = PartitionScan(["src", "mid", "end"], {"mid": ["frames", "cards"], "gone": ["x"]})
    assert shape.relative == ("src", "mid", "mid/frames", "mid/cards", "end")
    assert shape.subdirs == {"gone": ("x",), "mid": ("frames", "cards")}  # kept for the cursor
    assert shape.tail == 10
    ints = (*range(10), 99, 98)  # 5 directories, then a tail
    assert shape.step_identity(ints, "src") == (0, 1)
    assert shape.step_identity(ints, "mid") == (2, 3)
    assert shape.step_identity(ints, "end") == (8, 9)
    assert shape.step_identity((), "end") == ABSENT

    (tmp_path / "mid" / "new").mkdir(parents=True)
    wider = PartitionScan(["src", "mid", "end"], {"mid": ["cards", "frames", "new"]})
    widened = shape.widen(ints, wider, f"{tmp_path}/")
    new = (tmp_path / "mid" / "new").lstat()
    assert widened == (0, 1, 2, 3, 6, 7, 4, 5, new.st_mtime_ns, new.st_ino, 8, 9, 99, 98)
    assert wider.step_identity(widened, "end") == (8, 9)


# ----------------------------------------------------------------------------- plan, judge
def _ticker(home: Path, sqlite_url: str) -> tuple[ResumeTicker, list[str]]:
    stores = stores_for(home, sqlite_url)
    for pk in ("p/e1", "p/e2"):
        seed(stores, pk)
    return ResumeTicker(SENSOR_STEPS, stores, TickConfig(workers=1)), ["p/e1", "p/e2", "p/e3"]


def test_plan_cold_then_unchanged_then_incremental(sqlite_url: str, pipeline_home: Path) -> None:
    ticker, keys = _ticker(pipeline_home, sqlite_url)
    stats = TickStats()
    cold = ticker._plan(keys, NOW, None, stats)
    assert (cold.mode, cold.chosen, stats.changed) == ("cold", keys, {"all": 3})
    assert cold.full_at == NOW.timestamp() and stats.row_queries == 1

    cursor = CursorState.decode(ticker.tick(keys, NOW, None).cursor)
    assert cursor is not None
    idle = ticker._plan(keys, NOW, cursor, TickStats())
    assert (idle.mode, idle.chosen) == ("unchanged", [])

    (ticker.stores.checkpoints.step_dir(StepKey("p", "e2", "mid")) / "frames" / "f0.png").unlink()
    key = StepKey("p", "e1", "src")
    ledger = ticker.stores.ledger
    assert isinstance(ledger, LedgerStore)  # the full store of stores_for, read as a reader
    assert ledger.claim(key, "r:1")
    stats = TickStats()
    changed = ticker._plan(keys, NOW, cursor, stats)
    assert (changed.mode, changed.chosen) == ("incremental", ["p/e1", "p/e2"])
    assert stats.changed == {"ledger": 1, "disk": 1}
    assert changed.full_at == cursor.full_at  # an incremental tick keeps the last full


def test_judge_phase_judges_every_step_of_the_chosen(sqlite_url: str, pipeline_home: Path) -> None:
    ticker, keys = _ticker(pipeline_home, sqlite_url)
    plan = ticker._plan(keys, NOW, None, TickStats())
    evaluations, calls, judged = ticker.dispatch.judge_batch(
        plan.chosen, NOW, plan.rows, plan.scanned, plan.shape, {}, deadline=float("inf")
    )
    assert judged == keys and calls == len(keys) * len(SENSOR_STEPS)
    launches = {(ev.step_id, ev.partition_key) for ev in evaluations if ev.launch}
    # The seeded partitions are complete; the new one goes in one run, every step in it.
    assert launches == {(s, "p/e3") for s in ("src", "mid", "end", "side")}
    assert len({ev.run_key for ev in evaluations if ev.launch}) == 1


# ----------------------------------------------------------------------------- memoise, blocks
@dataclass
class _Ev:
    """The fields of a StepEvaluation that memoise and block_diff read."""

    step_id: str
    partition_key: str
    verdict: Verdict = Verdict.SKIP
    launch: bool = False
    run_key: str | None = None
    block_signature: str | None = None
    running_healthy: bool = False  # another run holds a live lease: no block

    @property
    def slot(self) -> str:
        return f"{self.step_id}|{self.partition_key}"


def _evs(*evs: _Ev) -> list[StepEvaluation]:
    return cast(list[StepEvaluation], list(evs))


def test_memoise_launches_once_and_keeps_unjudged_memos(
    sqlite_url: str, pipeline_home: Path
) -> None:
    ticker, keys = _ticker(pipeline_home, sqlite_url)
    plan = ticker._plan(keys, NOW, None, TickStats())
    plan.chosen = ["p/e2", "p/e3"]  # p/e1 not chosen; p/e2 chosen but left over (budget)
    run = _Ev("src", "p/e3", Verdict.LAUNCH, launch=True, run_key="k1")
    old = {"p/e1": cast(Any, "memo of e1")}
    launches, memos = memoise(plan, _evs(run), ["p/e3"], old, ResumeSettings(), NOW)
    assert launches == _evs(run)
    assert memos["p/e1"] == old["p/e1"] == "memo of e1"  # untouched
    assert "p/e2" not in memos  # no memo: judged first next tick
    # Left over with a memo (a refresh that ran out of budget): it keeps what it knew.
    e2_memo = cast(Any, "e2")
    kept, memos2 = memoise(
        plan, _evs(run), ["p/e3"], old | {"p/e2": e2_memo}, ResumeSettings(), NOW
    )
    assert memos2["p/e2"] == e2_memo == "e2" and kept == _evs(run)
    assert memos["p/e3"].launched == frozenset({"k1"})
    assert memos["p/e3"].tree == plan.scanned["p/e3"].ints
    again, _ = memoise(plan, _evs(run), ["p/e3"], old | memos, ResumeSettings(), NOW)
    assert again == []  # the same run key is not launched twice


def test_block_diff_never_reports_a_live_lease_and_clears_only_published_blocks() -> None:
    """docs/DESIGN.md#reports: a step another run holds a live lease on is no block (the judge
    says BLOCK with a signature): not reported, not kept, so its end clears nothing; a block
    published before is cleared once when a run takes the step up."""

    def live(pk: str) -> _Ev:
        return _Ev("mid", pk, Verdict.BLOCKED, block_signature="l", running_healthy=True)

    before = {"mid|p/e2": "b"}
    evs = _evs(live("p/e1"), live("p/e2"))
    checks, after = block_diff(evs, before, ["p/e1", "p/e2"], ["mid"])
    assert [(c.evaluation.slot, c.passed) for c in checks] == [("mid|p/e2", True)]
    assert after == {}
    checks, after = block_diff(_evs(_Ev("mid", "p/e1")), after, ["p/e1"], ["mid"])
    assert checks == [] and after == {}  # the lease ended: nothing was published to clear


def test_block_diff_reports_only_changes() -> None:
    before = {"mid|p/e1": "a", "mid|p/e2": "b", "mid|p/gone": "c", "old|p/e1": "d"}
    evs = _evs(
        _Ev("mid", "p/e1", block_signature="a"),  # same block: no report
        _Ev("mid", "p/e2", block_signature="b2"),  # changed block: failed again
        _Ev("end", "p/e1", block_signature="e"),  # new block
        _Ev("src", "p/e1"),  # never blocked: nothing
    )
    cleared = _Ev("mid", "p/e1")
    checks, after = block_diff(evs, before, ["p/e1", "p/e2"], ["src", "mid", "end"])
    assert [(c.evaluation.slot, c.passed) for c in checks] == [
        ("mid|p/e2", False),
        ("end|p/e1", False),
    ]
    assert after == {"mid|p/e1": "a", "mid|p/e2": "b2", "end|p/e1": "e"}  # gone slots dropped
    assert before["mid|p/gone"] == "c"  # the input is not changed
    checks, after = block_diff(_evs(cleared), after, ["p/e1", "p/e2"], ["src", "mid", "end"])
    assert [(c.evaluation.slot, c.passed) for c in checks] == [("mid|p/e1", True)]
    assert "mid|p/e1" not in after


# ----------------------------------------------------------------------------- next cursor
def test_next_cursor_resumes_memory_and_full_refresh(sqlite_url: str, pipeline_home: Path) -> None:
    ticker, keys = _ticker(pipeline_home, sqlite_url)
    first = ticker.tick(keys, NOW, None)
    state = CursorState.decode(first.cursor)
    assert state is not None
    assert (state.scope, state.token, state.full_at) == (
        ticker.scope,
        ticker._token,
        NOW.timestamp(),
    )
    assert state.ledger == ticker.stores.ledger.cursor()
    assert state.subdirs == {"mid": ("frames",)}  # found in the envelopes: now watched
    assert ticker.tick(keys, NOW, first.cursor).stats.mode == "unchanged"
    # Another process's cursor: idle while nothing changed, everything judged once it has.
    foreign = replace(state, token="another process")
    assert ticker.tick(keys, NOW, foreign.encode()).stats.mode == "unchanged"
    assert ticker.tick(keys, NOW, replace(foreign, pending=1).encode()).stats.mode == "cold"


# ----------------------------------------------------------------------------- hold back
def test_hold_back_waits_for_a_run_in_flight_unless_it_looks_dead() -> None:
    """docs/DESIGN.md#sensor: a run of the partition not ended yet holds its launches back;
    a stale-lease recovery never waits, nor does a started run silent for a whole lease."""
    lease = 60.0
    epoch = NOW.timestamp()

    def ev(pk: str, action: ResumeAction = ResumeAction.RERUN_SELF) -> StepEvaluation:
        return StepEvaluation("src", pk, ResumeDecision(action, "x"), Verdict.LAUNCH, "")

    trace = format_timestamp(datetime.fromtimestamp(epoch - 10, UTC))
    rows = {StepKey("p", "busy", "src"): LedgerRow(status="completed", updated_at=trace)}
    launches = [
        ev("p/idle"),  # nothing in flight
        ev("p/queued"),  # a run queued: held, no wake (the queue starts it)
        ev("p/busy"),  # started long ago, but a row moved 10 s ago: held until the lease
        ev("p/silent"),  # started long ago, no trace since: taken for dead
        ev("p/lapsed", ResumeAction.STALE_RUNNING_RECOVERY),  # the lease lapsed: never held
    ]
    in_flight = {
        "p/queued": None,
        "p/busy": epoch - 3600,
        "p/silent": epoch - 3600,
        "p/lapsed": epoch - 5,
    }
    kept, held = hold_back(launches, in_flight, rows, epoch, lease)
    assert [e.partition_key for e in kept] == ["p/idle", "p/silent", "p/lapsed"]
    assert held == {"p/queued": None, "p/busy": epoch - 10 + lease}


def test_a_held_partition_is_judged_again_when_its_run_ends(
    sqlite_url: str, pipeline_home: Path
) -> None:
    ticker, keys = _ticker(pipeline_home, sqlite_url)
    asked: list[set[str]] = []
    flights: dict[str, float | None] = {"p/e3": None}  # p/e3 never ran; a run is queued

    def in_flight(partitions: Collection[str]) -> dict[str, float | None]:
        asked.append(set(partitions))
        return {pk: flights[pk] for pk in partitions if pk in flights}

    first = ticker.tick(keys, NOW, None, in_flight)
    assert first.launches == [] and first.stats.held == 1
    assert asked == [{"p/e3"}]  # only the partitions with launches are asked about
    still = ticker.tick(keys, NOW, first.cursor, in_flight)
    assert still.stats.mode == "unchanged" and still.launches == []
    flights.clear()  # the run ended
    ended = ticker.tick(keys, NOW, still.cursor, in_flight)
    assert ended.stats.changed == {"run": 1}
    assert [ev.step_id for ev in ended.launches] == ["src", "mid", "end", "side"]
    asked.clear()
    assert ticker.tick(keys, NOW, ended.cursor, in_flight).stats.mode == "unchanged"
    assert asked == []  # nothing to launch, nothing held: Dagster is not asked


def test_a_partition_a_backfill_targets_is_held_until_the_backfill_ends(
    sqlite_url: str, pipeline_home: Path
) -> None:
    """docs/DESIGN.md#sensor: a backfill in progress launches its partitions' runs itself.
    The tick requests nothing of them (a stale-lease recovery neither), says which backfill
    holds them, judges them no more while it goes on, and judges them again (``backfill``)
    once it has ended, requesting what it left undone."""
    ticker, keys = _ticker(pipeline_home, sqlite_url)
    asked: list[set[str]] = []
    active = {"p/e3": "bf-1"}  # p/e3 never ran; a backfill targets it, no run of it yet

    def backfilling(partitions: Collection[str]) -> dict[str, str]:
        asked.append(set(partitions))
        return {pk: active[pk] for pk in partitions if pk in active}

    first = ticker.tick(keys, NOW, None, backfilling=backfilling)
    assert first.launches == [] and first.stats.held == 1
    assert first.stats.backfills == {"p/e3": "bf-1"}
    assert "held: backfill bf-1 targets p/e3" in first.stats.line()
    assert asked == [{"p/e3"}]  # only the partitions with launches are asked about
    still = ticker.tick(keys, NOW, first.cursor, backfilling=backfilling)
    assert still.stats.mode == "unchanged" and still.launches == []
    active.clear()  # the backfill ended (completed, failed or canceled) with p/e3 undone
    ended = ticker.tick(keys, NOW, still.cursor, backfilling=backfilling)
    assert ended.stats.changed == {"backfill": 1}
    assert [ev.step_id for ev in ended.launches] == ["src", "mid", "end", "side"]
    assert ended.stats.backfills == {} and "held: backfill" not in ended.stats.line()


def test_a_backfill_holds_a_stale_lease_recovery_too() -> None:
    """Unlike a run in flight (whose lapsed lease is evidence of its death), a backfill in
    progress has not run the partition yet, or its run recovers the row itself."""

    def ev(pk: str, action: ResumeAction) -> StepEvaluation:
        return StepEvaluation("src", pk, ResumeDecision(action, "x"), Verdict.LAUNCH, "")

    launches = [
        ev("p/free", ResumeAction.RERUN_SELF),
        ev("p/filled", ResumeAction.RERUN_SELF),
        ev("p/lapsed", ResumeAction.STALE_RUNNING_RECOVERY),
    ]
    kept, held = hold_for_backfills(launches, {"p/filled": "bf-1", "p/lapsed": "bf-2"})
    assert [e.partition_key for e in kept] == ["p/free"]
    assert held == {"p/filled": "bf-1", "p/lapsed": "bf-2"}
    assert hold_for_backfills(launches, {}) == (launches, {})


def test_decide_says_which_backfill_holds_a_launch() -> None:
    """``decide`` shows the sensor's hold on the launch rows: the backfill's id, and what
    happens once it has ended. The verdict stays the judge's."""
    from pipeline_defs.operations.shadow_decide import judged_item

    decision = ResumeDecision(ResumeAction.RERUN_SELF, "first run")
    ev = StepEvaluation("src", "p/e1", decision, Verdict.LAUNCH, "")
    item = judged_item(ev, backfill="bf-1")
    assert item["verdict"] == "launch"
    assert item["what_to_do"].startswith("held: backfill bf-1 targets it"), item
    assert not judged_item(ev)["what_to_do"]
