"""The resume sensor in real Dagster: launches, check evaluations, cursor, time, zero writes.

Prior states come from real ``dg.materialize`` runs of the test steps (and, for bulk
partitions, the same run protocol without Dagster), then ledger operations or file edits.
Ticks are evaluated with ``build_sensor_context`` against a test instance whose
``episodes`` partitions are registered.
"""

import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from sensor_steps import (
    SENSOR_STEPS,
    VERIFY_CALLS,
    delete_row,
    materialize,
    seed,
    set_row,
    snapshot,
    write_input,
)
from tcp_proxy import TcpProxy

from pipeline_defs.definitions import build_defs, build_resources
from pipeline_defs.judging.registry import forget_tickers, ticker_for
from pipeline_defs.judging.stores import Stores
from pipeline_defs.judging.tick_result import TickConfig, TickStats
from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.wiring.assets import RESUME_CHECK, build_step_assets
from resources.checkpoints.published import published_checkpoints
from resources.ledger.reads import Reads
from resources.ledger.store import LedgerStore
from resources.pipeline import LedgerPointers, PipelineResource
from resources.storage import ObjectMeta
from resources.testing import MemoryStorage
from sensors.report import REPORT_JOB, reported
from sensors.resume_sensor import DEFAULT_INTERVAL_SECONDS, TAG_VALUE_LIMIT, build_resume_sensor

TIMEOUT = 600
FULL_REFRESH = 3600.0


class _Lines(logging.Handler):
    """Collects the sensor's tick log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@dataclass
class Rig:
    """A Dagster instance, the sensor with a settable clock, and the stores behind it."""

    instance: dg.DagsterInstance
    home: Path
    pipeline: PipelineResource
    now: datetime
    cursor: str | None = None
    last: Any = None
    log: "_Lines" = field(default_factory=lambda: _Lines())
    # What the sensor gets as its ``pipeline`` resource instead of ``pipeline`` (the stores
    # over a storage or a ledger that a test takes down); the defs keep ``pipeline``.
    resource: Stores | None = None
    sensor: dg.SensorDefinition = field(init=False)
    defs: dg.Definitions = field(init=False)

    def __post_init__(self) -> None:
        self.sensor = build_resume_sensor(
            SENSOR_STEPS, clock=lambda: self.now, full_refresh_seconds=FULL_REFRESH
        )
        self.defs = dg.Definitions(
            assets=build_step_assets(SENSOR_STEPS),
            sensors=[self.sensor],
            resources=build_resources(self.pipeline),
        )

    @property
    def stores(self) -> Stores:
        return Stores.of(self.resource if self.resource is not None else self.pipeline)

    @property
    def stats(self) -> TickStats:
        ticker = ticker_for(
            "resume_sensor",
            SENSOR_STEPS,
            self.stores,
            TickConfig(full_refresh_seconds=FULL_REFRESH),
        )
        assert ticker.last_stats is not None
        return ticker.last_stats

    def add(self, *partition_keys: str) -> None:
        self.instance.add_dynamic_partitions("episodes", list(partition_keys))

    def tick(self, *, fresh: bool = False) -> Any:
        """Evaluate one tick (``fresh``: without the cursor, as after a lost cursor)."""
        context = dg.build_sensor_context(
            instance=self.instance,
            cursor=None if fresh else self.cursor,
            definitions=self.defs,
            resources={"pipeline": self.resource if self.resource is not None else self.pipeline},
        )
        context.log.addHandler(self.log)
        with dg.partition_loading_context(dynamic_partitions_store=self.instance):
            result = self.sensor.evaluate_tick(context)  # also validates the run requests
        self.cursor = result.cursor
        self.last = result
        return result

    def runs(self, result: Any = None) -> dict[str, dg.RunRequest]:
        """The step runs requested, by partition (at most one each: docs/DESIGN.md#sensor)."""
        result = result or self.last
        found: dict[str, dg.RunRequest] = {}
        for request in result.run_requests or []:
            if request.job_name == REPORT_JOB:
                continue
            assert request.partition_key not in found, "two runs for one partition"
            found[request.partition_key] = request
        return found

    def requests(self, result: Any = None) -> dict[tuple[str, str], dg.RunRequest]:
        """(step, partition) → the run request that holds it."""
        return {
            (asset.to_user_string(), pk): request
            for pk, request in self.runs(result).items()
            for asset in request.asset_selection or ()
        }

    def selection(self, pk: str, result: Any = None) -> list[str]:
        """The steps of the run requested for ``pk`` (dependency order), [] if none."""
        request = self.runs(result).get(pk)
        return [a.to_user_string() for a in request.asset_selection or ()] if request else []

    def checks(self, result: Any = None) -> dict[tuple[str, str | None], dg.AssetCheckEvaluation]:
        result = result or self.last
        evaluations = [r.evaluation() for r in reported(result.run_requests or [])]
        return {(ev.asset_key.to_user_string(), ev.partition): ev for ev in evaluations}

    def key(self, pk: str, step_id: str) -> StepKey:
        return Episode.parse(pk).step(step_id)

    def step_dir(self, pk: str, step_id: str) -> Path:
        return self.stores.checkpoints.step_dir(self.key(pk, step_id))


def _make_rig(instance: dg.DagsterInstance, db_url: str, home: Path) -> Iterator[Rig]:
    forget_tickers()
    for pk in instance.get_dynamic_partitions("episodes"):
        instance.delete_dynamic_partition("episodes", pk)
    pipeline = PipelineResource(home=str(home), db_url=db_url, running_timeout_seconds=TIMEOUT)
    LedgerStore(db_url).migrate()
    yield Rig(instance, home, pipeline, datetime.now(UTC))
    forget_tickers()


@pytest.fixture
def rig(instance: dg.DagsterInstance, db_url: str, pipeline_home: Path) -> Iterator[Rig]:
    yield from _make_rig(instance, db_url, pipeline_home)


@pytest.fixture
def sqlite_rig(instance: dg.DagsterInstance, sqlite_url: str, pipeline_home: Path) -> Iterator[Rig]:
    yield from _make_rig(instance, sqlite_url, pipeline_home)


def _values(check: dg.AssetCheckEvaluation) -> dict[str, Any]:
    return {k: getattr(v, "value", v) for k, v in check.metadata.items()}


# --------------------------------------------------------------------------- wiring
def test_definitions_wire_the_sensor_with_defaults(pipeline_home: Path) -> None:
    defs = build_defs(steps=SENSOR_STEPS, pipeline=PipelineResource(home=str(pipeline_home)))
    (sensor,) = [s for s in defs.sensors or [] if s.name == "resume_sensor"]
    assert sensor.minimum_interval_seconds == 30
    assert sensor.default_status is dg.DefaultSensorStatus.RUNNING
    assert sensor.required_resource_keys == {"pipeline"}
    custom = build_resume_sensor(SENSOR_STEPS, minimum_interval_seconds=5, name="other")
    assert (custom.name, custom.minimum_interval_seconds) == ("other", 5)


# --------------------------------------------------------------------------- each decision kind
KINDS = {
    # partition: (what is done to it, expected launches, expected failed checks)
    "p/clean": ("nothing", {}, {}),
    # Never run: every step in the partition's one run (each a first run).
    "p/first": (
        "never run",
        {"src": "rerun_self", "mid": "rerun_self", "end": "rerun_self", "side": "rerun_self"},
        {},
    ),
    "p/cpgone": ("mid checkpoint.json deleted", {"mid": "rerun_self"}, {}),
    "p/pnggone": ("mid frames/f0.png deleted", {"mid": "rerun_self"}, {}),
    "p/failed": ("src failed", {"src": "rerun_self"}, {}),
    "p/backoff": ("src failed, retry in 60s", {}, {}),
    "p/healthy": ("mid running 10s", {}, {}),  # a live lease: no launch, not a failed check
    "p/stale": ("mid running past timeout", {"mid": "stale_running_recovery"}, {}),
    "p/nullstart": ("mid running, NULL started_at", {}, {"mid": ("step.resume_blocked", "none")}),
    "p/exhausted": ("src failed 3 times", {}, {"src": ("step.recovery_exhausted", "none")}),
    "p/drift": (
        "mid verify: invariant drift",
        {},
        {"mid": ("step.resume_blocked", "invariant_drift")},
    ),
    "p/crash": ("mid verify crashes", {}, {"mid": ("step.verify_crashed", "verify_crashed")}),
    "q/config": ("end's scoped key edited", {}, {"end": ("step.resume_blocked", "contract_drift")}),
    "p/na": ("side not applicable", {}, {}),
    "p/orphan": ("src row deleted, clean checkpoint", {}, {}),
}


def _prepare(rig: Rig) -> None:
    stores, ledger, now = rig.stores, rig.stores.ledger, rig.now
    materialize(rig.instance, rig.pipeline, "p/clean")  # a real Dagster run
    for pk in KINDS:
        if pk not in ("p/clean", "p/first"):
            seed(stores, pk)
    rig.add(*KINDS)
    (rig.step_dir("p/cpgone", "mid") / "checkpoint.json").unlink()
    (rig.step_dir("p/pnggone", "mid") / "frames" / "f0.png").unlink()
    for pk, retries in (("p/failed", 1), ("p/backoff", 1), ("p/exhausted", 4)):
        key = rig.key(pk, "src")
        for n in range(retries):
            assert ledger.claim(key, f"f{n}:0", auto_recovery=n > 0, reason="auto")
            assert ledger.transition(key, f"f{n}:0", "failed")
    set_row(
        stores,
        rig.key("p/backoff", "src"),
        retry_not_before=format_timestamp(now + timedelta(seconds=60)),
    )
    started = format_timestamp(now - timedelta(seconds=10))
    assert ledger.claim(rig.key("p/healthy", "mid"), "busy:0", now=started)
    old = format_timestamp(now - timedelta(seconds=TIMEOUT + 5))
    assert ledger.claim(rig.key("p/stale", "mid"), "dead:0", now=old)
    assert ledger.claim(rig.key("p/nullstart", "mid"), "odd:0")
    set_row(stores, rig.key("p/nullstart", "mid"), started_at=None)
    write_input(rig.home, "p/drift", "verify.json", {"mid": "drift"})
    write_input(rig.home, "p/crash", "verify.json", {"mid": "crash"})
    config = rig.home / "projects" / "q" / "project.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump({"style": "watercolor"}))
    write_input(rig.home, "p/na", "no_side", "")
    delete_row(stores, rig.key("p/orphan", "src"))


def test_every_decision_kind_becomes_a_launch_a_wait_or_a_block(rig: Rig) -> None:
    _prepare(rig)
    before = snapshot(rig.stores)
    result = rig.tick()
    launches = rig.requests()
    checks = rig.checks()
    for pk, (what, expect_launch, expect_block) in KINDS.items():
        got = {s: r.tags["resume/action"] for (s, p), r in launches.items() if p == pk}
        assert got == expect_launch, (pk, what)
        blocks = {
            s: (_values(c)["code"], _values(c)["origin"]) for (s, p), c in checks.items() if p == pk
        }
        assert blocks == expect_block, (pk, what)
    for pk, request in rig.runs().items():
        steps = rig.selection(pk)
        assert steps == [s for s in ("src", "mid", "end", "side") if s in steps]  # dependency order
        first = steps[0] if len(steps) == 1 else f"{steps[0]}+{len(steps) - 1}"
        assert request.run_key and request.run_key.startswith(f"resume:{first}:{pk}:")
        assert request.tags["resume/action"] in ("rerun_self", "stale_running_recovery")
        assert request.tags["resume/steps"] == str(len(steps))
        assert request.tags["resume/state"] == request.run_key.rsplit(":", 1)[1]
        assert "resume/mode" not in request.tags  # never a force
        for tag in ("resume/origin", "resume/reason"):
            assert 0 < len(request.tags[tag]) <= TAG_VALUE_LIMIT
    for check in checks.values():
        assert check.check_name == RESUME_CHECK and not check.passed
        values = _values(check)
        assert values["reason"] and values["what_to_do"]
    assert "reset-running" in _values(checks[("mid", "p/nullstart")])["what_to_do"]
    assert "resume/mode=force" in _values(checks[("end", "q/config")])["what_to_do"]
    assert "style" in _values(checks[("end", "q/config")])["reason"]
    # One run per partition; a settled step is never in it for its upstream's sake (p/failed
    # re-runs src alone), and nothing below a running or blocked step is launched.
    assert set(launches) == {
        (step_id, pk) for pk, (_, expected, _) in KINDS.items() for step_id in expected
    }
    assert result.cursor
    # Zero writes: ledger rows, audit rows, provider calls and the whole tree (bytes and
    # mtimes) are identical after a cold, a warm, a time-driven and a memory-less tick.
    rig.tick()
    rig.now += timedelta(seconds=TIMEOUT)
    rig.tick()
    forget_tickers()
    rig.tick(fresh=True)
    assert snapshot(rig.stores) == before


# --------------------------------------------------------------------------- cursor
def test_a_tick_without_changes_judges_nothing(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    for n in range(3):
        seed(rig.stores, f"p/e{n}")
    rig.add("p/e0", "p/e1", "p/e2")
    VERIFY_CALLS.clear()
    rig.tick()
    # Cold: everything judged, but every checkpoint was sealed clean by its run and is
    # unchanged, so no verifier runs again (tests/checkpoints/test_seals.py covers the seal itself).
    assert rig.stats.mode == "cold" and rig.stats.judged == 12
    assert sum(VERIFY_CALLS.values()) == 0
    queries: list[Any] = []
    original = Reads.get_many

    def counted(self: Reads, **kw: Any) -> dict[StepKey, LedgerRow]:
        queries.append(kw)
        return original(self, **kw)

    monkeypatch.setattr(Reads, "get_many", counted)
    VERIFY_CALLS.clear()
    result = rig.tick()
    assert sum(VERIFY_CALLS.values()) == 0 and not queries
    assert rig.stats.mode == "unchanged" and rig.stats.judged == 0
    assert not result.run_requests and not rig.checks(result)
    # Even a restarted code server (no memory) skips on an unchanged cursor.
    forget_tickers()
    rig.tick()
    assert sum(VERIFY_CALLS.values()) == 0 and not queries
    assert rig.stats.mode == "unchanged"


def test_changes_are_noticed_and_only_changed_partitions_are_judged(rig: Rig) -> None:
    pks = [f"p/e{n}" for n in range(6)]
    for pk in pks:
        seed(rig.stores, pk)
    rig.add(*pks)
    rig.tick()
    assert rig.stats.mode == "cold" and rig.stats.evaluated_partitions == 6

    def changed(expect: set[str], why: str) -> set[tuple[str, str]]:
        VERIFY_CALLS.clear()
        rig.tick()
        stats = rig.stats
        assert stats.mode == "incremental", stats.line()
        assert stats.evaluated_partitions == len(expect), stats.line()
        assert stats.changed == {why: len(expect)}, stats.line()
        assert stats.row_queries == 1, stats.line()
        assert sum(VERIFY_CALLS.values()) <= 4 * len(expect)
        return set(rig.requests())

    # A deleted checkpoint file, a deleted PNG in an artifact sub-directory.
    (rig.step_dir("p/e0", "end") / "checkpoint.json").unlink()
    assert changed({"p/e0"}, "disk") == {("end", "p/e0")}
    (rig.step_dir("p/e1", "mid") / "frames" / "f0.png").unlink()
    assert changed({"p/e1"}, "disk") == {("mid", "p/e1")}
    # A checkpoint edited in place (same file, its directory untouched): a hand edit with an
    # editor that writes over the file. Seen at the next tick, a block naming the step.
    envelope = rig.step_dir("p/e4", "end") / "checkpoint.json"
    raw = json.loads(envelope.read_text(encoding="utf-8"))
    raw["data"]["edited"] = "by hand"
    envelope.write_text(json.dumps(raw), encoding="utf-8")  # truncated and written over
    assert changed({"p/e4"}, "disk") == set()
    assert rig.checks()[("end", "p/e4")].passed is False
    # A ledger write (through the ledger's own operations).
    key = rig.key("p/e2", "side")
    assert rig.stores.ledger.claim(key, "x:0") and rig.stores.ledger.transition(
        key, "x:0", "failed"
    )
    assert changed({"p/e2"}, "ledger") == {("side", "p/e2")}
    # An episode input file and a new partition.
    write_input(rig.home, "p/e3", "verify.json", {"src": "drift"})
    assert changed({"p/e3"}, "disk") == set()
    assert rig.checks()[("src", "p/e3")].passed is False
    rig.add("p/e9")
    assert changed({"p/e9"}, "new") == {(s, "p/e9") for s in ("src", "mid", "end", "side")}
    assert rig.selection("p/e9") == ["src", "mid", "end", "side"]  # one run, dependency order
    # The project file: every partition of the project.
    (rig.home / "projects" / "p").mkdir(parents=True, exist_ok=True)
    (rig.home / "projects" / "p" / "project.yaml").write_text("style: noir\n")
    VERIFY_CALLS.clear()
    rig.tick()
    assert rig.stats.evaluated_partitions == 7
    assert {(s, p) for (s, p) in rig.checks() if s == "end"} == {
        ("end", pk) for pk in ("p/e1", "p/e2", "p/e3", "p/e5")
    }  # p/e0's end has no checkpoint (re-run), p/e9 never ran: not config-blocked; p/e4's
    # end was blocked by its edit already (its check failed then, and stays failed)


def test_full_refresh_rejudges_everything_periodically(sqlite_rig: Rig) -> None:
    rig = sqlite_rig
    seed(rig.stores, "p/e1")
    rig.add("p/e1")
    rig.tick()
    rig.tick()
    assert rig.stats.mode == "unchanged"
    # An in-place rewrite of an artifact keeps every directory entry: only a full refresh
    # notices it (as drift: present but different bytes).
    png = rig.step_dir("p/e1", "mid") / "frames" / "f0.png"
    png.write_bytes(b"edited in place")
    rig.tick()
    assert rig.stats.mode == "unchanged"
    rig.now += timedelta(seconds=FULL_REFRESH + 1)
    rig.tick()
    assert rig.stats.mode == "full" and rig.stats.judged == 4
    assert not rig.checks()[("mid", "p/e1")].passed


# --------------------------------------------------------------------------- run keys
def test_same_state_same_run_key_and_a_new_state_relaunches(rig: Rig) -> None:
    seed(rig.stores, "p/e1")
    rig.add("p/e1")
    key = rig.key("p/e1", "src")
    assert rig.stores.ledger.claim(key, "r1:0") and rig.stores.ledger.transition(
        key, "r1:0", "failed"
    )
    first = rig.requests(rig.tick())[("src", "p/e1")].run_key
    assert not rig.tick().run_requests  # cursor: nothing changed, nothing requested again
    forget_tickers()
    again = rig.requests(rig.tick(fresh=True))[("src", "p/e1")].run_key
    assert again == first  # a lost cursor re-requests the same key: Dagster dedupes it
    # The launched run claims, fails again: a new state, a new launch.
    assert rig.stores.ledger.claim(key, "r2:0", auto_recovery=True, reason="auto")
    assert not rig.checks(rig.tick())  # running healthy: its own run shows it, not a fault
    assert rig.stores.ledger.transition(key, "r2:0", "failed")
    result = rig.tick()
    second = rig.requests(result)[("src", "p/e1")].run_key
    assert second != first
    assert not rig.checks(result)  # a live lease was never reported: nothing to clear


def test_a_new_partition_is_finished_by_the_one_run_of_one_tick(sqlite_rig: Rig) -> None:
    """docs/DESIGN.md#sensor: every step of a new partition goes in one run, not one per tick."""
    rig = sqlite_rig
    rig.add("p/e1")
    order: list[list[str]] = []
    for _ in range(4):
        runs = rig.runs(rig.tick())
        if not runs:
            break
        (request,) = runs.values()
        steps = rig.selection("p/e1")
        order.append(steps)
        result = materialize(rig.instance, rig.pipeline, "p/e1", steps, tags=request.tags)
        assert result.success
    assert order == [["src", "mid", "end", "side"]]
    for step_id in ("src", "mid", "end", "side"):
        row = rig.stores.ledger.get(rig.key("p/e1", step_id))
        assert row is not None and row.status == "completed", step_id
    rig.tick()
    assert not rig.last.run_requests and not rig.checks()


# --------------------------------------------------------------------------- time
def test_backoff_defers_until_retry_not_before(sqlite_rig: Rig) -> None:
    rig = sqlite_rig
    seed(rig.stores, "p/e1")
    rig.add("p/e1")
    key = rig.key("p/e1", "src")
    assert rig.stores.ledger.claim(key, "r1:0") and rig.stores.ledger.transition(
        key, "r1:0", "failed"
    )
    set_row(rig.stores, key, retry_not_before=format_timestamp(rig.now + timedelta(seconds=60)))
    assert not rig.requests(rig.tick())
    assert rig.stats.deferred == 1
    rig.now += timedelta(seconds=30)
    rig.tick()
    assert rig.stats.mode == "unchanged"
    rig.now += timedelta(seconds=31)
    requests = rig.requests(rig.tick())
    assert rig.stats.changed == {"time": 1}
    assert set(requests) == {("src", "p/e1")}


def test_a_running_row_turns_stale_by_time_alone(sqlite_rig: Rig) -> None:
    rig = sqlite_rig
    seed(rig.stores, "p/e1")
    rig.add("p/e1")
    key = rig.key("p/e1", "mid")
    started = format_timestamp(rig.now - timedelta(seconds=10))
    assert rig.stores.ledger.claim(key, "w:0", now=started)
    rig.tick()
    assert not rig.requests()
    assert not rig.checks()  # a live lease is no failure
    rig.now += timedelta(seconds=TIMEOUT)
    request = rig.requests(rig.tick())[("mid", "p/e1")]
    assert request.tags["resume/action"] == "stale_running_recovery"
    assert not rig.checks()  # never reported blocked: nothing to clear


def test_a_live_lease_is_counted_running_never_blocked_nor_cleared(sqlite_rig: Rig) -> None:
    """docs/DESIGN.md#reports: a step another run holds a live lease on is no block. The
    tick's line counts it running (not blocked) and logs no BLOCK; when its owner finishes,
    no "no longer blocked" check is published for a block that never was. A block that was
    published is cleared once when a run takes the step up."""
    rig = sqlite_rig
    seed(rig.stores, "p/e1")
    rig.add("p/e1")
    key = rig.key("p/e1", "mid")
    started = format_timestamp(rig.now - timedelta(seconds=10))
    assert rig.stores.ledger.claim(key, "w:0", now=started)
    rig.tick()
    assert not rig.checks()
    assert not [line for line in rig.log.lines if line.startswith("BLOCK")]
    line = rig.log.lines[0]
    assert rig.stats.blocked == 0 and ", 0 blocked" in line, line
    assert rig.stats.running == 1 and "1 running" in line, line
    rig.now += timedelta(seconds=1)
    rig.tick()  # unchanged: still not a block
    assert rig.stats.mode == "unchanged" and rig.stats.blocked == 0
    assert rig.stores.ledger.transition(key, "w:0", "completed")  # the owner finishes
    rig.tick()
    assert rig.stats.evaluated_partitions == 1 and not rig.checks()  # nothing to clear
    # A published block (a verifier's drift) taken up by a run (an operator's force): the
    # published block is cleared once, and nothing more when that run ends.
    write_input(rig.home, "p/e1", "verify.json", {"mid": "drift"})
    rig.tick()
    assert not rig.checks()[("mid", "p/e1")].passed and rig.stats.blocked == 1
    write_input(rig.home, "p/e1", "verify.json", {})
    assert rig.stores.ledger.claim(key, "force:0", now=format_timestamp(rig.now))
    rig.tick()
    cleared = rig.checks()[("mid", "p/e1")]
    assert cleared.passed and rig.stats.blocked == 0 and rig.stats.running == 1
    assert "running" in str(cleared.description), cleared.description
    assert rig.stores.ledger.transition(key, "force:0", "completed")
    rig.tick()
    assert not rig.checks() and rig.stats.blocked == 0


def test_exhaustion_is_reported_once_and_a_recovery_passes(sqlite_rig: Rig) -> None:
    rig = sqlite_rig
    materialize(rig.instance, rig.pipeline, "p/e1")
    key = rig.key("p/e1", "src")
    for n in range(4):
        assert rig.stores.ledger.claim(key, f"f{n}:0", auto_recovery=n > 0, reason="boom")
        assert rig.stores.ledger.transition(key, f"f{n}:0", "failed")
    rig.tick()
    check = rig.checks()[("src", "p/e1")]
    assert not check.passed and _values(check)["code"] == "step.recovery_exhausted"
    logged = [line for line in rig.log.lines if line.startswith("BLOCK src [p/e1]")]
    assert len(logged) == 1 and "step.recovery_exhausted" in logged[0]  # the tick log
    assert not rig.requests()
    write_input(rig.home, "p/e1", "unrelated.txt", "x")  # re-judged, same block
    rig.tick()
    assert rig.stats.evaluated_partitions == 1 and not rig.checks()
    # An explicit force (a human's decision) rebuilds it; the block clears once.
    assert materialize(
        rig.instance, rig.pipeline, "p/e1", ["src"], tags={"resume/mode": "force"}
    ).success
    rig.tick()
    assert rig.checks()[("src", "p/e1")].passed
    assert rig.selection("p/e1") == ["mid", "end", "side"]  # force staled them: one run
    rig.tick()
    assert not rig.checks()


def test_reports_are_stored_by_the_instance_again_and_again(sqlite_rig: Rig) -> None:
    """Block, clear, block the same asset partition: every report run is stored.

    Run-less evaluations (what the sensor returned before) are refused by Dagster's index
    the second time; the daemon-path test (test_sensor_daemon.py) shows the wedge end to end.
    """
    rig = sqlite_rig
    seed(rig.stores, "p/e1")
    rig.add("p/e1")
    statuses = []
    evaluations: list[dg.AssetCheckEvaluation] = []
    for verdict in ({"end": "typed"}, {}, {"end": "typed"}):
        write_input(rig.home, "p/e1", "verify.json", verdict)
        rig.tick()
        (request,) = [r for r in rig.last.run_requests if r.job_name == REPORT_JOB]
        job = rig.defs.get_job_def(REPORT_JOB)
        assert job.execute_in_process(run_config=request.run_config, instance=rig.instance).success
        history = rig.instance.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(dg.AssetKey("end"), RESUME_CHECK), limit=1
        )  # the newest record (the module's instance holds earlier runs' checks too)
        statuses.append(history[0].status.value)
        event = history[0].event
        assert event is not None and event.dagster_event is not None
        evaluation = event.dagster_event.event_specific_data
        assert isinstance(evaluation, dg.AssetCheckEvaluation), evaluation
        assert evaluation.partition == "p/e1"
        evaluations.append(evaluation)
    assert statuses == ["FAILED", "SUCCEEDED", "FAILED"]
    assert evaluations[-1].metadata["code"].value


def test_malformed_partition_keys_are_reported_once_and_never_judged(sqlite_rig: Rig) -> None:
    """a key added by hand in the UI ("oops no slash") used to become a block
    per step with a force hint for a partition that cannot exist."""
    rig = sqlite_rig
    seed(rig.stores, "p/e1")
    rig.add("p/e1", "oops no slash", "p/e1/x")
    rig.tick()
    assert not rig.requests() and not rig.checks()
    warned = [line for line in rig.log.lines if "malformed episodes partition" in line]
    assert len(warned) == 1 and "oops no slash" in warned[0] and "p/e1/x" in warned[0]
    write_input(rig.home, "p/e1", "unrelated.txt", "x")
    rig.tick()
    assert len([line for line in rig.log.lines if "malformed" in line]) == 1  # once


def test_an_invalid_project_file_asks_for_a_fix_not_a_force(sqlite_rig: Rig) -> None:
    rig = sqlite_rig
    seed(rig.stores, "p/e1")
    rig.add("p/e1")
    config = rig.home / "projects" / "p" / "project.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("no_such_key: 1\n")
    rig.tick()
    checks = rig.checks()
    assert checks and all(not c.passed for c in checks.values())
    for check in checks.values():
        values = _values(check)
        assert "config.invalid" in values["reason"]
        assert "resume/mode=force" not in values["what_to_do"]
        assert "fix the project file" in values["what_to_do"]


@pytest.mark.parametrize("death", ["failed", "deleted"])
def test_a_row_whose_owner_run_ended_is_relaunched_without_waiting(
    sqlite_rig: Rig, death: str
) -> None:
    """Dead owners (docs/DESIGN.md#dead-owners): the owner run is FAILURE while its heartbeat
    is fresh; the sensor launches the step at once (its run's judge takes the row over). A
    run deleted from the instance is unknown here, as another deployment's would be: no
    launch while its heartbeat is fresh."""
    rig = sqlite_rig
    seed(rig.stores, "p/e1")
    rig.add("p/e1")
    ended = materialize(rig.instance, rig.pipeline, "p/e1", ["src"])
    if death == "failed":
        rig.instance.report_run_failed(rig.instance.get_run_by_id(ended.run_id))  # type: ignore[arg-type]
    else:
        rig.instance.delete_run(ended.run_id)
    key = rig.key("p/e1", "mid")
    assert rig.stores.ledger.claim(key, f"{ended.run_id}:0")  # a fresh, live-looking lease
    rig.tick()
    if death == "deleted":
        # A run this instance does not know may be another deployment's, alive: the
        # heartbeat alone decides, and it is fresh (docs/DESIGN.md#dead-owners).
        assert ("mid", "p/e1") not in rig.requests()
        return
    request = rig.requests()[("mid", "p/e1")]
    assert "owner-ended" in str(request.run_key)
    assert request.tags["resume/action"] == "stale_running_recovery"
    assert "owner run ended (FAILURE)" in request.tags["resume/reason"]
    result = materialize(rig.instance, rig.pipeline, "p/e1", ["mid"], tags=request.tags)
    assert result.success
    row = rig.stores.ledger.get(key)
    assert row is not None and row.status == "completed"


def test_a_partition_with_a_run_in_flight_waits_for_it(sqlite_rig: Rig) -> None:
    """docs/DESIGN.md#sensor: the steps a run in flight has not reached yet look like work
    (no row yet); a second run of them would race its claims. The partition waits for that
    run to end, then the next tick requests what is left, once."""
    rig = sqlite_rig
    seed(rig.stores, "p/e1", "src")
    rig.add("p/e1", "p/e2")
    run = dg.DagsterRun(
        job_name="__ASSET_JOB",
        run_id="0d8b8a4e-5b1c-4f57-9f5a-2f0c2b6a1c01",
        status=dg.DagsterRunStatus.STARTED,
        tags={"dagster/partition": "p/e1"},
        asset_selection=frozenset({dg.AssetKey("src"), dg.AssetKey("mid")}),
    )
    rig.instance.add_run(run)
    try:
        rig.tick()
        assert set(rig.runs()) == {"p/e2"}  # another partition is not held
        assert rig.stats.held == 1 and "1 partitions held" in rig.stats.line()
        assert not rig.tick().run_requests  # still in flight: nothing to do
        rig.instance.report_run_failed(run)
        rig.tick()
        assert rig.stats.changed == {"run": 1}
        assert rig.selection("p/e1") == ["mid", "end", "side"]
        assert not rig.tick().run_requests
    finally:
        rig.instance.delete_run(run.run_id)


def _started_run(instance: dg.DagsterInstance, pk: str) -> dg.DagsterRun:
    """A run this instance shows STARTED, as a killed ``storyboard materialize`` leaves it."""
    import uuid

    run = dg.DagsterRun(
        job_name="resume_steps",
        run_id=str(uuid.uuid4()),
        status=dg.DagsterRunStatus.STARTED,
        tags={"dagster/partition": pk},
    )
    instance.add_run(run)
    return run


def test_a_run_whose_claims_stopped_heartbeating_is_ended_so_its_queue_opens(
    sqlite_rig: Rig,
) -> None:
    """A killed run stays STARTED for ever under a launcher that cannot check its
    workers, and the episode's recovery waits behind it in the run queue. Once every claim
    of the run has lapsed and missed one more heartbeat (and it holds no live claim) the
    sensor marks it failed, naming the ledger evidence; never before. That keeps a killed
    worker's cost within one lease plus two sensor intervals plus the dequeue interval."""
    rig = sqlite_rig
    seed(rig.stores, "p/e1", "src")
    rig.add("p/e1")
    lease = rig.stores.settings.lease_seconds
    killed = _started_run(rig.instance, "p/e1")
    key = rig.key("p/e1", "mid")
    assert rig.stores.ledger.claim(key, f"{killed.run_id}:0")
    beat = datetime.now(UTC)

    def status() -> dg.DagsterRunStatus:
        found = rig.instance.get_run_by_id(killed.run_id)
        assert found is not None
        return found.status

    rig.now = beat + timedelta(seconds=lease / 2)  # alive
    rig.tick()
    assert status() is dg.DagsterRunStatus.STARTED
    beats = rig.stores.settings.heartbeat_seconds
    rig.now = beat + timedelta(seconds=lease + beats / 2)  # lapsed, one beat may be late
    rig.tick()
    assert status() is dg.DagsterRunStatus.STARTED
    assert ("mid", "p/e1") in rig.requests()
    # The bound: within one sensor interval of the lapse (the other interval and the dequeue
    # start the recovery the sensor already requested).
    rig.now = beat + timedelta(seconds=lease + min(beats * 1.5, DEFAULT_INTERVAL_SECONDS))
    rig.tick()
    assert status() is dg.DagsterRunStatus.FAILURE
    failure = [
        e
        for e in rig.instance.all_logs(killed.run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == "PIPELINE_FAILURE"
    ]
    assert failure and "p/e1:mid" in failure[-1].message, failure
    assert "stopped heartbeating" in failure[-1].message
    assert any(f"run {killed.run_id} marked failed" in line for line in rig.log.lines)


def test_a_run_with_a_live_claim_or_unknown_here_is_never_ended(sqlite_rig: Rig) -> None:
    """One claim silent, another of the same run still heartbeating: the run works on. A run
    this instance does not know (another deployment's) is never touched."""
    import uuid

    rig = sqlite_rig
    seed(rig.stores, "p/e1", "src")
    rig.add("p/e1")
    lease = rig.stores.settings.lease_seconds
    working = _started_run(rig.instance, "p/e1")
    silent, live = rig.key("p/e1", "mid"), rig.key("p/e1", "side")
    assert rig.stores.ledger.claim(silent, f"{working.run_id}:0")
    assert rig.stores.ledger.claim(live, f"{working.run_id}:0")
    foreign = rig.key("p/e1", "end")
    assert rig.stores.ledger.claim(foreign, f"{uuid.uuid4()}:0")
    old = format_timestamp(datetime.now(UTC) - timedelta(seconds=10 * lease))
    set_row(rig.stores, silent, heartbeat_at=old, started_at=old)
    set_row(rig.stores, foreign, heartbeat_at=old, started_at=old)
    rig.now = datetime.now(UTC)
    rig.tick()
    found = rig.instance.get_run_by_id(working.run_id)
    assert found is not None and found.status is dg.DagsterRunStatus.STARTED


def _run_status(rig: Rig, run_id: str) -> dg.DagsterRunStatus:
    found = rig.instance.get_run_by_id(run_id)
    assert found is not None
    return found.status


def test_a_run_whose_coordinator_stopped_renewing_is_ended_even_without_a_running_row(
    rig: Rig,
) -> None:
    """Run leases (docs/DESIGN.md#run-leases). ``storyboard materialize`` killed while a
    worker runs its step; the step finishes on the worker after the kill: the run holds no
    running row, and the claims rule alone never ended it (its recovery run then waited in
    the queue behind it for good). Its coordinator's run lease stopped being renewed: the
    sensor ends it within one beat past the lease, and not before."""
    seed(rig.stores, "p/e1", "src")
    rig.add("p/e1")
    settings = rig.stores.settings
    dead = _started_run(rig.instance, "p/e1")
    taken = datetime.now(UTC)
    rig.stores.ledger.begin_run(dead.run_id, now=format_timestamp(taken))
    assert not [
        r for r in rig.stores.ledger.running_rows() if str(r.run_id).startswith(dead.run_id)
    ]

    rig.now = taken + timedelta(seconds=settings.lease_seconds)  # lapsed, one beat may be late
    rig.tick()
    assert _run_status(rig, dead.run_id) is dg.DagsterRunStatus.STARTED
    rig.now = taken + timedelta(seconds=settings.lease_seconds + settings.heartbeat_seconds + 1)
    rig.tick()
    assert _run_status(rig, dead.run_id) is dg.DagsterRunStatus.FAILURE
    failure = [
        e
        for e in rig.instance.all_logs(dead.run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == "PIPELINE_FAILURE"
    ]
    assert failure and "stopped renewing its run lease" in failure[-1].message, failure
    rig.tick()  # the lease of the ended run is closed: the open leases stay the live ones
    assert dead.run_id not in rig.stores.ledger.run_leases(open_only=True)


def test_a_run_whose_coordinator_renews_is_never_ended_whatever_its_claims_say(
    rig: Rig,
) -> None:
    """A live coordinator whose steps wait in a queue (one worker, many episodes): its claim
    rows may look silent for a long time; the run lease it renews keeps it alive. Before,
    the claims rule ended such runs, and they went on claiming steps under a FAILED run."""
    seed(rig.stores, "p/e1", "src")
    rig.add("p/e1")
    settings = rig.stores.settings
    live = _started_run(rig.instance, "p/e1")
    key = rig.key("p/e1", "mid")
    assert rig.stores.ledger.claim(key, f"{live.run_id}:0:{'a' * 12}")
    old = format_timestamp(datetime.now(UTC) - timedelta(seconds=10 * settings.lease_seconds))
    set_row(rig.stores, key, heartbeat_at=old, started_at=old)  # a silent claim
    rig.now = datetime.now(UTC)
    rig.stores.ledger.begin_run(live.run_id, now=format_timestamp(rig.now))
    rig.tick()
    assert _run_status(rig, live.run_id) is dg.DagsterRunStatus.STARTED
    # Once its coordinator stops (its lease ended, then silent past the limit, as a
    # coordinator killed right after its end would leave it) the run is ended: the rule holds.
    rig.stores.ledger.end_run(live.run_id, now=old)
    rig.now += timedelta(seconds=settings.lease_seconds + settings.heartbeat_seconds + 1)
    rig.tick()
    assert _run_status(rig, live.run_id) is dg.DagsterRunStatus.FAILURE


def test_a_run_whose_coordinator_renews_keeps_its_partition_held(sqlite_rig: Rig) -> None:
    """docs/DESIGN.md#run-leases: a started run that has left no trace in its partition's
    rows for a whole lease was taken for dead, and a second run of its steps requested
    beside it (its steps merely waited for a worker). Its coordinator's run lease is its
    sign of life now: while it renews, the partition waits; a run without one is judged as
    before."""
    rig = sqlite_rig
    seed(rig.stores, "p/e1", "src")
    seed(rig.stores, "p/e2", "src")
    rig.add("p/e1", "p/e2")
    runs = {}
    for pk in ("p/e1", "p/e2"):
        runs[pk] = dg.DagsterRun(
            job_name="__ASSET_JOB",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.STARTED,
            tags={"dagster/partition": pk},
            asset_selection=frozenset({dg.AssetKey("mid"), dg.AssetKey("end")}),
        )
        rig.instance.add_run(runs[pk])
    rig.now = datetime.now(UTC) + timedelta(seconds=5 * rig.stores.settings.lease_seconds)
    rig.stores.ledger.begin_run(runs["p/e1"].run_id, now=format_timestamp(rig.now))
    rig.tick()
    assert set(rig.runs()) == {"p/e2"}, rig.runs()  # the leased run's partition is held
    assert _run_status(rig, runs["p/e1"].run_id) is dg.DagsterRunStatus.STARTED


def test_a_launch_that_failed_before_changing_anything_is_launched_again_bounded(
    sqlite_rig: Rig,
) -> None:
    """docs/DESIGN.md#stranded-runs: the broker down, the sensor's run fails before it claims
    anything; the partition judges the same, to the same run key, which Dagster launches
    once: before, it said "launch now" for ever with nothing launched. Now the same
    judgement is launched again under a key of its own after a counted backoff, at most
    ``max_recovery_attempts`` times, then waits for a change and says so."""
    rig = sqlite_rig
    pk = "p/stranded"  # run keys of its own: the module's instance holds other tests' runs
    seed(rig.stores, pk, "src")
    rig.add(pk)
    settings = rig.stores.settings
    rig.now = datetime.now(UTC)
    rig.tick()
    (request,) = rig.runs().values()
    base = str(request.run_key)
    assert ":again" not in base
    keys = [base]
    for attempt in range(1, settings.max_recovery_attempts + 2):
        run = dg.DagsterRun(
            job_name="__ASSET_JOB",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.STARTED,
            tags={
                "dagster/partition": pk,
                "dagster/run_key": keys[-1],
                "dagster/sensor_name": "resume_sensor",
            },
            asset_selection=frozenset(request.asset_selection or ()),
        )
        rig.instance.add_run(run)
        rig.now = datetime.now(UTC)
        rig.tick()
        assert not rig.runs()  # in flight: held
        rig.instance.report_run_failed(run, "kombu.exceptions.OperationalError: broker down")
        rig.now = datetime.now(UTC)
        rig.tick()
        assert not rig.runs(), f"attempt {attempt}: launched again before its backoff"
        rig.now += timedelta(seconds=settings.retry_backoff_seconds * attempt + 1)
        rig.tick()
        if attempt > settings.max_recovery_attempts:
            assert not rig.runs()
            said = f"storyboard materialize --partition {pk}"
            assert any(said in line for line in rig.log.lines)
            break
        (again,) = rig.runs().values()
        assert again.run_key == f"{base}:again{attempt}", again.run_key
        keys.append(str(again.run_key))
    assert len(keys) == settings.max_recovery_attempts + 1


def _stranded_until_exhausted(rig: Rig, pk: str, request: dg.RunRequest) -> list[str]:
    """Every launch of ``request`` fails before it changes anything (the broker down), each
    after its backoff, until the sensor stops launching it; the run keys it requested."""
    settings = rig.stores.settings
    keys = [str(request.run_key)]
    for attempt in range(1, settings.max_recovery_attempts + 2):
        run = dg.DagsterRun(
            job_name="__ASSET_JOB",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.STARTED,
            tags={
                "dagster/partition": pk,
                "dagster/run_key": keys[-1],
                "dagster/sensor_name": "resume_sensor",
            },
            asset_selection=frozenset(request.asset_selection or ()),
        )
        rig.instance.add_run(run)
        rig.instance.report_run_failed(run, "kombu.exceptions.OperationalError: broker down")
        backoff = settings.retry_backoff_seconds * attempt + 1
        rig.now = datetime.now(UTC) + timedelta(seconds=backoff)
        rig.tick()
        if attempt > settings.max_recovery_attempts:
            assert not rig.runs()
            return keys
        assert not rig.checks(), f"attempt {attempt}: reported before its attempts ran out"
        (again,) = rig.runs().values()
        keys.append(str(again.run_key))
    raise AssertionError("launched again past max_recovery_attempts")


def test_a_stranded_launch_past_its_attempts_is_a_failed_check_until_it_launches_again(
    sqlite_rig: Rig,
) -> None:
    """docs/DESIGN.md#stranded-runs: a launch whose relaunches all failed before changing
    anything waits for a change. It was only a warning in the sensor's log; now the steps of
    that launch show it where blocks show: a failed ``resume_integrity`` check naming the
    failure and the command, published once, and passed once the partition launches again."""
    rig = sqlite_rig
    pk = "p/exhausted-launch"  # run keys of its own: the module's instance keeps other runs
    seed(rig.stores, pk, "src")
    rig.add(pk)
    rig.now = datetime.now(UTC)
    rig.tick()
    (request,) = rig.runs().values()
    steps = [a.to_user_string() for a in request.asset_selection or ()]
    assert steps == ["mid", "end", "side"]
    attempts = len(_stranded_until_exhausted(rig, pk, request))
    checks = rig.checks()
    assert set(checks) == {(step, pk) for step in steps}, checks
    said = f"storyboard materialize --partition {pk}"
    for check in checks.values():
        assert check.check_name == RESUME_CHECK and not check.passed
        values = _values(check)
        assert said in values["what_to_do"], values
        failed = f"failed {attempts} times before it changed anything"
        assert failed in values["reason"], values
    # Reported once: the next ticks (a change elsewhere, time passing) say nothing again.
    rig.now += timedelta(seconds=3600)
    rig.tick()
    assert not rig.runs() and not rig.checks()
    # An operator's change (src re-run by hand, its row moved): the partition is judged
    # again, launched under a new key, and the stranded report clears once.
    key = rig.key(pk, "src")
    assert rig.stores.ledger.claim(key, "hand:0", reason="by hand")
    assert rig.stores.ledger.transition(key, "hand:0", "failed")
    rig.now = datetime.now(UTC)
    rig.tick()
    assert rig.selection(pk) == ["src", "mid", "end", "side"]
    cleared = rig.checks()
    assert set(cleared) == {(step, pk) for step in steps} and all(
        c.passed for c in cleared.values()
    ), cleared
    rig.tick()
    assert not rig.checks()


class _Switched(MemoryStorage):
    """The shared storage, up or down: down, every call is ``storage.unavailable`` (what the
    object store raises once its retries are spent)."""

    down = False

    def _reachable(self, key: str) -> None:
        if self.down:
            raise PipelineError(ErrorCode.STORAGE_UNAVAILABLE, f"storage {self.url}: down ({key})")

    def get(self, key: str) -> bytes:
        self._reachable(key)
        return super().get(key)

    def head(self, key: str) -> ObjectMeta | None:
        self._reachable(key)
        return super().head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        self._reachable(prefix)
        return super().list(prefix)


def _bucket_stores(rig: Rig, home: Path, storage: MemoryStorage, ledger: LedgerStore) -> Stores:
    """A machine on the bucket: its own scratch ``home``, the shared storage; the commit
    pointers read through ``ledger``."""
    checkpoints = published_checkpoints(home, storage, LedgerPointers(ledger))
    return Stores(rig.stores.settings, rig.stores.ledger, checkpoints)


def _skip_reason(rig: Rig) -> str:
    return str(rig.last.skip_message or "")


def test_a_storage_outage_while_judging_defers_the_partition(
    sqlite_rig: Rig, tmp_path: Path
) -> None:
    """An outage is not a block: the storage down while the tick judges a partition (its
    retries spent) said nothing of its checkpoints. It was reported as contract drift, a
    failed check only a force lifts, and "cleared" once the storage came back. Now the
    partition is deferred: nothing launched, nothing reported, the tick says which
    partitions wait for which outage, and the next tick judges it and launches as usual."""
    rig = sqlite_rig
    pk = "p/storage-down"
    storage = _Switched(tmp_path.name)
    ledger = rig.stores.ledger
    seed(_bucket_stores(rig, tmp_path / "worker", storage, ledger), pk, "src")
    rig.resource = _bucket_stores(rig, tmp_path / "sensor", storage, ledger)
    rig.add(pk)
    storage.down = True
    rig.tick()
    assert not rig.runs() and not rig.checks(), rig.checks()
    for said in (_skip_reason(rig), "\n".join(rig.log.lines)):
        assert "storage.unavailable" in said and pk in said, said
    rig.tick()  # still down: judged again, still nothing
    assert rig.stats.evaluated_partitions == 0 and rig.stats.changed, rig.stats
    assert not rig.runs() and not rig.checks()
    storage.down = False
    rig.tick()
    assert rig.selection(pk) == ["mid", "end", "side"]
    assert not rig.checks()  # no "cleared" for a block never published


def test_a_ledger_outage_defers_the_partition_or_the_tick(
    instance: dg.DagsterInstance, pg_url: str, pipeline_home: Path, tmp_path: Path
) -> None:
    """The ledger (PostgreSQL) out of reach, its retries spent: while a partition is judged
    (the commit pointers of its checkpoints), the partition is deferred as for the storage;
    from the tick's first read, the whole tick waits and says so. Neither reports a block
    nor launches; the tick after the outage launches as usual. The outage is a real one: the
    connections go through a TCP proxy that the test cuts (the pointers through one of
    their own, so that the cut meets the tick while it judges)."""
    pk = "p/ledger-down"
    with (
        TcpProxy(sa.make_url(pg_url).port or 5432) as tick_link,
        TcpProxy(sa.make_url(pg_url).port or 5432) as pointer_link,
    ):
        for rig in _make_rig(instance, pg_url, pipeline_home):

            def via(proxy: TcpProxy) -> LedgerStore:
                url = sa.make_url(pg_url).set(port=proxy.port)
                return LedgerStore(url.render_as_string(hide_password=False))

            storage = MemoryStorage(tmp_path.name)
            seed(_bucket_stores(rig, tmp_path / "worker", storage, rig.stores.ledger), pk, "src")
            sensor = _bucket_stores(rig, tmp_path / "sensor", storage, via(pointer_link))
            rig.resource = Stores(sensor.settings, via(tick_link), sensor.checkpoints)
            rig.add(pk)
            pointer_link.cut()  # the pointers only: the tick's own reads still pass
            rig.tick()
            assert not rig.runs() and not rig.checks(), rig.checks()
            assert "ledger.unavailable" in _skip_reason(rig) and pk in _skip_reason(rig)
            tick_link.cut()  # from the tick's first read
            rig.tick()
            assert not rig.runs() and not rig.checks()
            assert "ledger.unavailable" in _skip_reason(rig), _skip_reason(rig)
            tick_link.restore()
            pointer_link.restore()
            rig.tick()
            assert rig.selection(pk) == ["mid", "end", "side"]
            assert not rig.checks()
