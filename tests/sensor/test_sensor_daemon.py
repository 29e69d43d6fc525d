"""The resume sensor through the real daemon, which stores what every tick returns.

Calling the sensor function shows what it returns, not what Dagster then does with it. Here a
``dagster dev`` (webserver + daemon) runs the shipped wiring (``build_defs``) on two real
steps, with Dagster's storage on SQLite and on PostgreSQL, and the test drives one partition
through three block → clear cycles while another step of it is re-run each cycle:

- a block (the story edited after its checkpoint) must show as a failed ``resume_integrity``
  check on that asset partition, with origin and reason;
- the clearance (the edit undone) must show as a passed check;
- a missing checkpoint of the other step must be re-run by a sensor launch, every cycle;
- no tick of the sensor may fail.

Before the fix the daemon stored each block as a run-less check evaluation, and the second
one for the same asset partition broke Dagster's unique index: every later tick failed and
nothing was launched again.

And on all ten storyboard steps (docs/DESIGN.md#sensor): a newly added episode is finished
by ONE run the sensor launches, not by one single-step run per tick.
"""

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from cli_helpers import TESTS_DIR
from dagster_dev import (
    create_database,
    dagster_dev,
    drop_database,
    graphql,
    log_tail,
    start_sensor,
    write_workspace,
)

from pipeline_defs.resume.partition import Episode
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.storyboard import STORYBOARD_STEPS, sample_stories
from resources.ledger.store import LedgerStore

pytestmark = [pytest.mark.webserver, pytest.mark.xdist_group("sensor_daemon")]

LOCATION = "daemon_tests"
PARTITION = "demo/ep01"
CYCLES = 3
TERMINAL = frozenset({"SUCCESS", "FAILURE", "CANCELED"})

TICKS_QUERY = """
query($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status ticks(limit: 1000) {
        status timestamp runIds error { message } } } }
    ... on PythonError { message }
  }
}
"""


@dataclass
class Daemon:
    url: str
    log: Path
    home: Path
    instance: dg.DagsterInstance

    @property
    def story(self) -> Path:
        episode = Episode.parse(PARTITION)
        return (
            self.home
            / "projects"
            / episode.project_id
            / "episodes"
            / episode.episode_id
            / "story.md"
        )

    def checkpoint_dir(self, step_id: str) -> Path:
        episode = Episode.parse(PARTITION)
        return self.home / "checkpoints" / episode.project_id / episode.episode_id / step_id

    def ticks(self) -> list[dict[str, Any]]:
        selector = {
            "repositoryLocationName": LOCATION,
            "repositoryName": "__repository__",
            "sensorName": "resume_sensor",
        }
        data = graphql(self.url, TICKS_QUERY, {"selector": selector})["sensorOrError"]
        assert data["__typename"] == "Sensor", data
        return list(data["sensorState"]["ticks"])

    def failed_ticks(self) -> list[str]:
        return [str(t["error"]) for t in self.ticks() if t["status"] == "FAILURE"]

    def check(self, step_id: str) -> Any:
        key = dg.AssetCheckKey(dg.AssetKey(step_id), "resume_integrity")
        records = self.instance.event_log_storage.get_asset_check_execution_history(key, limit=50)
        mine = [r for r in records if r.partition == PARTITION and r.evaluation is not None]
        return mine[0] if mine else None

    def step_runs(self, step_id: str) -> list[dg.DagsterRun]:
        runs = self.instance.get_runs(dg.RunsFilter(tags={"dagster/partition": PARTITION}))
        return [r for r in runs if r.asset_selection and dg.AssetKey(step_id) in r.asset_selection]

    def wait(self, what: str, predicate: Any, timeout: float = 180) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            failed = self.failed_ticks()
            assert not failed, f"a sensor tick failed while waiting for {what}: {failed[:2]}"
            value = predicate()
            if value:
                return value
            time.sleep(1)
        raise AssertionError(f"timed out waiting for {what}\n{log_tail(self.log)}")


def _dagster_yaml(storage: str, pg_server_url: str | None) -> tuple[dict[str, Any], str | None]:
    config: dict[str, Any] = {"telemetry": {"enabled": False}}
    if storage == "sqlite":
        return config, None
    assert pg_server_url
    name, url = create_database(pg_server_url, "sd_dagster")
    config["storage"] = {
        "postgres": {"postgres_url": url.replace("postgresql+psycopg://", "postgresql+psycopg2://")}
    }
    return config, name


@pytest.fixture(params=["sqlite", "postgresql"])
def daemon(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemon]:
    storage = str(request.param)
    pg_server_url = request.getfixturevalue("pg_server_url") if storage == "postgresql" else None
    with _deployment(tmp_path, storage, pg_server_url, "defs", "{}\n") as d:
        yield d


# Small pictures: the ten steps' images are drawn offline in the run.
SMALL_IMAGES = "image: {width: 128, height: 96}\nimages: {ref_min_mentions: 3}\n"


@pytest.fixture
def storyboard_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """The ten storyboard steps (``daemon_location.storyboard_defs``), SQLite storage."""
    with _deployment(tmp_path, "sqlite", None, "storyboard_defs", SMALL_IMAGES) as d:
        yield d


@contextlib.contextmanager
def _deployment(
    tmp_path: Path, storage: str, pg_server_url: str | None, attribute: str, project: str
) -> Iterator[Daemon]:
    """``dagster dev`` on ``daemon_location.<attribute>`` with PARTITION registered."""
    home, dagster_home = tmp_path / "home", tmp_path / "dagster_home"
    home.mkdir()
    dagster_home.mkdir()
    config, database = _dagster_yaml(storage, pg_server_url)
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(config))
    workspace = write_workspace(
        tmp_path / "workspace.yaml", "daemon_location", attribute, LOCATION, TESTS_DIR
    )
    python_path = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(":")
    env = {
        **os.environ,
        "PIPELINE_HOME": str(home),
        "PIPELINE_DB_URL": f"sqlite:///{home / 'ledger.sqlite3'}",
        "DAGSTER_HOME": str(dagster_home),
        "PYTHONPATH": python_path,
    }
    env.pop("STORYBOARD_DEFS", None)
    episode = Episode.parse(PARTITION)
    story = home / "projects" / episode.project_id / "episodes" / episode.episode_id / "story.md"
    story.parent.mkdir(parents=True)
    story.write_bytes(sample_stories()["ep01"].read_bytes())
    (home / "projects" / episode.project_id / "project.yaml").write_text(project)
    instance = dg.DagsterInstance.from_config(str(dagster_home))
    instance.add_dynamic_partitions("episodes", [PARTITION])
    log = tmp_path / "dagster_dev.log"
    try:
        with dagster_dev(workspace, env, tmp_path, log) as (url, _process):
            yield Daemon(url, log, home, instance)
    finally:
        instance.dispose()
        if database and pg_server_url:
            drop_database(pg_server_url, database)


def _succeeded_after(d: Daemon, step_id: str, count: int) -> bool:
    runs = d.step_runs(step_id)
    done = [r for r in runs if r.status.value == "SUCCESS"]
    return len(done) > count and all(r.status.value in TERMINAL for r in runs)


def test_block_clear_cycles_never_fail_a_tick(daemon: Daemon) -> None:
    d = daemon
    # The sensor judges the new partition and launches both steps in one run.
    d.wait("first runs", lambda: _succeeded_after(d, "entity_canon", 0))
    original = d.story.read_bytes()
    for cycle in range(CYCLES):
        # Block: the story edited after its checkpoint is contract drift on story_source.
        d.story.write_bytes(original + f"\nAn edit, cycle {cycle}.\n".encode())
        blocked = d.wait(
            f"cycle {cycle}: failed check",
            lambda: (r := d.check("story_source")) is not None and r.status.value == "FAILED" and r,
        )
        metadata = blocked.evaluation.metadata
        assert metadata["origin"].value == "contract_drift"
        assert "story" in metadata["reason"].value
        # Clear: the edit undone; the check passes again.
        d.story.write_bytes(original)
        d.wait(
            f"cycle {cycle}: passed check",
            lambda: (r := d.check("story_source")) is not None and r.status.value == "SUCCEEDED",
        )
        # A launch: entity_canon's checkpoint removed → the sensor re-runs that step alone.
        before = len([r for r in d.step_runs("entity_canon") if r.status.value == "SUCCESS"])
        shutil.rmtree(d.checkpoint_dir("entity_canon"))
        d.wait(f"cycle {cycle}: relaunch", lambda n=before: _succeeded_after(d, "entity_canon", n))
        assert (d.checkpoint_dir("entity_canon") / "checkpoint.json").is_file()
    ticks = d.ticks()
    assert ticks, "the daemon never ticked the sensor"
    assert not [t for t in ticks if t["status"] == "FAILURE"]
    assert len(d.step_runs("story_source")) == 1  # never re-run by a block or a clearance


def test_a_new_episode_is_finished_by_one_sensor_run(storyboard_daemon: Daemon) -> None:
    """docs/DESIGN.md#sensor: the episode registered before ``dagster dev`` started is judged
    by the first tick, which launches ONE run holding all ten steps; that run completes
    every one of them, and later ticks launch nothing more. Before, the sensor launched one
    single-step run per tick (eight ticks for ten steps)."""
    d = storyboard_daemon
    ordered = [s.step_id for s in StepGraph(STORYBOARD_STEPS).ordered]
    ledger = LedgerStore(f"sqlite:///{d.home / 'ledger.sqlite3'}")
    episode = Episode.parse(PARTITION)

    def completed() -> bool:
        rows = ledger.get_many(episodes=[episode])
        done = {k.step_id for k, r in rows.items() if str(r.status) == "completed"}
        return done == set(ordered)

    d.wait("all ten steps completed", completed, timeout=600)
    d.wait("the run to end", lambda: all(r.status.value in TERMINAL for r in _step_runs(d)))
    ticks_before = len(d.ticks())
    d.wait("three more ticks", lambda: len(d.ticks()) >= ticks_before + 3)
    runs = _step_runs(d)  # one run, even after more ticks
    selections = [sorted(k.to_user_string() for k in r.asset_selection or ()) for r in runs]
    assert len(runs) == 1, selections
    (run,) = runs
    assert run.status.value == "SUCCESS"
    assert run.tags["dagster/sensor_name"] == "resume_sensor"
    assert run.asset_selection == {dg.AssetKey(s) for s in ordered}
    assert run.tags["resume/steps"] == "10"
    rows = ledger.get_many(episodes=[episode])
    assert {str(r.run_id).split(":")[0] for r in rows.values()} == {run.run_id}
    assert not d.failed_ticks()


def _step_runs(d: Daemon) -> list[dg.DagsterRun]:
    """Every run of the steps' job (block reports run in ``resume_report``)."""
    runs = d.instance.get_runs(dg.RunsFilter(tags={"dagster/partition": PARTITION}))
    return [r for r in runs if r.job_name != "resume_report"]


STOP_SENSOR = """
mutation($id: String) {
  stopSensor(id: $id) { __typename ... on PythonError { message } }
}
"""
SENSOR_ID_QUERY = """
query($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) { __typename ... on Sensor { sensorState { id } } }
}
"""
BACKFILL_MUTATION = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""
SKIPS_QUERY = """
query($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) { __typename ... on Sensor { sensorState {
      ticks(limit: 1000) { status timestamp skipReason runIds } } } }
}
"""
STEPS = STORYBOARD_STEPS[:2]  # daemon_location.defs: story_source, entity_canon
BACKFILLED = ("demo/bf01", "demo/bf02", "demo/bf03", "demo/bf04")
PARTLY = "demo/bf05"  # backfilled on its first step only: the sensor does the rest, after


@pytest.fixture
def sqlite_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """The two-step location on SQLite storage (one backend: the rule is Dagster's, not ours)."""
    with _deployment(tmp_path, "sqlite", None, "defs", "{}\n") as d:
        yield d


def _backfill(d: Daemon, partitions: list[str], steps: list[str]) -> str:
    params = {"partitionNames": partitions, "assetSelection": [{"path": [s]} for s in steps]}
    launched = graphql(d.url, BACKFILL_MUTATION, {"params": params})["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return str(launched["backfillId"])


def test_a_backfill_and_the_sensor_make_one_run_per_episode(sqlite_daemon: Daemon) -> None:
    """docs/DESIGN.md#sensor: a backfill of new episodes submitted while the sensor is on.
    Dagster's backfill daemon launches the backfill's runs on its next iteration; the sensor,
    ticking every second, judges the new episodes before that. It used to launch a run of
    its own per episode in that window, and the backfill's runs then waited in the queue and
    skipped every step (two runs per episode, the backfill done long after the work). The
    sensor now holds a partition an active backfill targets: one run per episode in all (the
    backfill's), each paying a clean run's calls, and nothing launched after it completed.
    An episode backfilled on its first step only is held too, and once that backfill has
    ended the sensor launches what it left undone: the second step, alone.

    The race is checked to have happened: a tick of the sensor falls between the backfills'
    submission and their first run, and says it held the episodes for the backfill."""
    d = sqlite_daemon
    selector = {
        "repositoryLocationName": LOCATION,
        "repositoryName": "__repository__",
        "sensorName": "resume_sensor",
    }
    ledger = LedgerStore(f"sqlite:///{d.home / 'ledger.sqlite3'}")
    # The episode registered at start: finished by the sensor alone, the clean run's calls.
    d.wait("the first episode's run", lambda: _succeeded_after(d, "entity_canon", 0))
    clean = ledger.episode_calls("demo", "ep01")
    # The sensor off while the new episodes are registered (it would launch them at once,
    # before any backfill exists), then on again the moment the backfills are submitted.
    state = graphql(d.url, SENSOR_ID_QUERY, {"selector": selector})["sensorOrError"]
    stopped = graphql(d.url, STOP_SENSOR, {"id": state["sensorState"]["id"]})["stopSensor"]
    assert stopped["__typename"] == "StopSensorMutationResult", stopped
    d.wait("the sensor to stop ticking", lambda: _no_tick_for(d, seconds=3.0))
    story = sample_stories()["ep01"].read_bytes()
    everyone = [*BACKFILLED, PARTLY]
    for pk in everyone:
        episode = Episode.parse(pk)
        path = d.home / "projects" / episode.project_id / "episodes" / episode.episode_id
        path.mkdir(parents=True)
        (path / "story.md").write_bytes(story)
    d.instance.add_dynamic_partitions("episodes", everyone)
    submitted = time.time()
    backfill_id = _backfill(d, list(BACKFILLED), [s.step_id for s in STEPS])
    partly_id = _backfill(d, [PARTLY], [STEPS[0].step_id])
    start_sensor(d.url, LOCATION)

    def completed(backfill: str) -> bool:
        found = d.instance.get_backfill(backfill)
        return found is not None and found.status.value == "COMPLETED_SUCCESS"

    d.wait(
        "the backfills to complete", lambda: completed(backfill_id) and completed(partly_id), 300
    )
    episode = Episode.parse(PARTLY)

    def finished() -> bool:
        rows = ledger.get_many(episodes=[episode])
        return len(rows) == len(STEPS) and {str(r.status) for r in rows.values()} == {"completed"}

    d.wait("the partly backfilled episode finished by the sensor", finished)
    d.wait("its runs to end", lambda: all(r.status.value in TERMINAL for r in _runs(d, [PARTLY])))
    ticks_before = len(d.ticks())
    d.wait("three more ticks", lambda: len(d.ticks()) >= ticks_before + 3)

    runs = _runs(d, list(BACKFILLED))
    first_backfill_run = min(
        (
            rec.create_timestamp.timestamp()
            for rec in d.instance.get_run_records(
                dg.RunsFilter(tags={"dagster/backfill": [backfill_id, partly_id]})
            )
        ),
        default=None,
    )
    assert first_backfill_run is not None, "the backfills launched no run"
    ticks = graphql(d.url, SKIPS_QUERY, {"selector": selector})["sensorOrError"]
    ticks = ticks["sensorState"]["ticks"]
    window = [t for t in ticks if submitted < t["timestamp"] < first_backfill_run]
    # It raced: the sensor ticked after the backfills were submitted, before their runs existed.
    assert window, "no sensor tick between the submission and the backfills' first run"
    by_partition = {
        pk: [r for r in runs if r.tags.get("dagster/partition") == pk] for pk in BACKFILLED
    }
    assert {pk: len(rs) for pk, rs in by_partition.items()} == dict.fromkeys(BACKFILLED, 1), [
        (r.tags.get("dagster/partition"), r.tags.get("dagster/sensor_name"), r.status.value)
        for r in runs
    ]
    assert all(r.tags.get("dagster/backfill") == backfill_id for r in runs)
    assert all(r.status.value == "SUCCESS" for r in runs)
    # The tick's line (its log, and its skip reason when it requested nothing) names them.
    said = d.log.read_text(errors="replace")
    assert "held: backfill" in said
    assert f"backfill {backfill_id} targets {', '.join(BACKFILLED)}" in said
    assert f"backfill {partly_id} targets {PARTLY}" in said
    # The partly backfilled episode: the backfill's run of the first step, then the sensor's
    # of the second alone, launched after the backfill had ended.
    partly = sorted(_runs(d, [PARTLY]), key=lambda r: r.run_id)
    kinds = {
        (
            "backfill"
            if r.tags.get("dagster/backfill") == partly_id
            else r.tags.get("dagster/sensor_name")
        ): r
        for r in partly
    }
    assert len(partly) == 2 and set(kinds) == {"backfill", "resume_sensor"}, [
        r.tags for r in partly
    ]
    assert kinds["resume_sensor"].asset_selection == {dg.AssetKey(STEPS[1].step_id)}
    ended = d.instance.get_backfill(partly_id)
    assert ended is not None and ended.backfill_end_timestamp is not None
    sensor_run = d.instance.get_run_record_by_id(kinds["resume_sensor"].run_id)
    assert sensor_run is not None
    assert sensor_run.create_timestamp.timestamp() >= ended.backfill_end_timestamp
    for pk in everyone:
        ep = Episode.parse(pk)
        assert ledger.episode_calls(ep.project_id, ep.episode_id) == clean, pk
    rows = ledger.get_many(episodes=[Episode.parse(pk) for pk in BACKFILLED])
    assert {str(r.status) for r in rows.values()} == {"completed"}
    assert len(rows) == len(BACKFILLED) * len(STEPS)
    assert not d.failed_ticks()


def _no_tick_for(d: Daemon, seconds: float) -> bool:
    """No tick started over ``seconds`` (one may have been under way when it was stopped)."""
    before = len(d.ticks())
    time.sleep(seconds)
    return len(d.ticks()) == before


def _runs(d: Daemon, partitions: list[str]) -> list[dg.DagsterRun]:
    """The step runs of ``partitions`` (block reports run in ``resume_report``)."""
    runs = d.instance.get_runs(dg.RunsFilter(tags={"dagster/partition": partitions}))
    return [r for r in runs if r.job_name != "resume_report"]
