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
