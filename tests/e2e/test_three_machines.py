"""Three machines end to end on object storage: they share only PostgreSQL and the bucket.

Each machine is its own process tree with its own empty ``PIPELINE_HOME`` and its own
``DAGSTER_HOME`` directory, holding the shipped ``deploy/dagster.yaml`` (runs, events and
sensor state in PostgreSQL: one Dagster instance for all three, as in production, so the
dead-owner rule sees every machine's runs). The ledger is another PostgreSQL database and
the checkpoints live in one S3 bucket (moto, ``PIPELINE_STORAGE_URL=s3://…``).

- Machine A runs ``dagster dev`` (webserver + daemon) on the ten storyboard steps.
- Machine B adds the episode (the inputs are published to the bucket) and runs
  ``storyboard materialize`` with slow offline models; the command's process group is
  SIGKILLed while a step is running (its row says ``running``, it has made a model call).
- Machine C, once B's lease has lapsed, runs ``storyboard materialize`` again: the steps B
  finished are skipped with no model call, the killed step is recovered (an expected-match
  steal of the stale lease) and the rest run.
- A's resume sensor is then turned on (it starts stopped: turned on earlier it would race
  B and C for the same steps, which the ledger keeps safe but the test could not assert).
  B's Dagster run, which nothing else ends (a SIGKILLed CLI run), was marked failed by C's
  takeover of its lease (left STARTED, it would keep the episode's queue shut).
  A picture deleted from the bucket is found by the sensor's scrub and relaunched
  self-only: one run holding only ``ref_image_gen``. An envelope overwritten in the bucket
  is reported as a block: a failed ``resume_integrity`` check, which Chromium shows on the
  asset's checks page (screenshot in the test's tmp dir, printed with ``-rP``).
- Nothing but scratch is written to any home: per-process copies under ``.scratch/`` and
  the inputs' cache under ``projects/`` (byte-equal to the published objects); no
  checkpoint tree outside the scratch, no ledger file.
"""

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from cli_helpers import ROOT, TESTS_DIR
from dagster_dev import (
    create_database,
    drop_database,
    free_port,
    graphql,
    log_tail,
    stop,
    wait_until_loaded,
    write_workspace,
)
from s3_server import SECRET, S3Server, running_s3_server
from storyboard_support import create_pg_database, drop_pg_database

from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.layout import SCRATCH_DIR
from pipeline_defs.resume.partition import Episode
from pipeline_defs.resume.settings import ENV_NAMES
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.storyboard import STORYBOARD_STEPS, sample_stories
from resources.checkpoints.manifest import Manifest
from resources.ledger.store import LedgerStore, engine_for
from resources.pipeline import ledger_for

pytestmark = [pytest.mark.webserver, pytest.mark.pg, pytest.mark.xdist_group("three_machines")]

CHROMIUM = "/usr/bin/chromium"
LOCATION = "three_machines"
PARTITION = "demo/ep01"
EPISODE = Episode.parse(PARTITION)
PREFIX = "storyboard"
STEP_IDS = [s.step_id for s in StepGraph(STORYBOARD_STEPS).ordered]
# Every machine: a lease short enough that C need not wait a minute after the kill, long
# enough (five heartbeats) that a live step on a loaded two-core machine keeps it.
LEASE_SECONDS = 10
HEARTBEAT_SECONDS = 2
LATENCY_MS = 500  # machine B's offline models: the kill lands inside a step
TERMINAL = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
SCREENSHOT = "bucket-block.png"

TICKS_QUERY = """
query($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status ticks(limit: 200) { status runIds error { message } } } }
    ... on PythonError { message }
  }
}
"""
START_SENSOR = """
mutation($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status } }
    ... on PythonError { message }
  }
}
"""
SENSOR_SELECTOR = {
    "repositoryLocationName": LOCATION,
    "repositoryName": "__repository__",
    "sensorName": "resume_sensor",
}


def _require_browser() -> bool:
    return os.environ.get("PIPELINE_REQUIRE_BROWSER", "") not in ("", "0", "false")


@dataclass
class Machine:
    """One machine: a root holding its empty home and its Dagster home, and its env."""

    name: str
    root: Path
    env: dict[str, str]

    @property
    def home(self) -> Path:
        return self.root / "home"

    def command(self, *args: str) -> list[str]:
        return [str(Path(sys.executable).with_name("storyboard")), *args]

    def storyboard(self, *args: str, timeout: float = 300) -> dict[str, Any]:
        """``storyboard ARGS --json`` to the end; its JSON payload (exit 0 required)."""
        done = subprocess.run(
            self.command(*args, "--json"),
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, (
            f"{self.name}: {args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
        payload: dict[str, Any] = json.loads(done.stdout)
        return payload

    def spawn(self, *args: str, log: Path) -> subprocess.Popen[bytes]:
        """``storyboard ARGS`` in a process group of its own (killed as one)."""
        with log.open("wb") as sink:
            return subprocess.Popen(
                self.command(*args),
                env=self.env,
                cwd=self.root,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


@dataclass
class Deployment:
    server: S3Server
    bucket: str
    ledger_url: str
    instance: dg.DagsterInstance
    a: Machine
    b: Machine
    c: Machine
    shots: Path
    logs: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def machines(self) -> tuple[Machine, Machine, Machine]:
        return (self.a, self.b, self.c)

    @property
    def ledger(self) -> LedgerStore:
        return ledger_for(self.ledger_url)

    def rows(self) -> dict[str, LedgerRow]:
        return {k.step_id: r for k, r in self.ledger.get_many(episodes=[EPISODE]).items()}

    def manifest(self, step_id: str) -> Manifest:
        row = self.rows()[step_id]
        assert row.checkpoint_pointer is not None, step_id
        return Manifest.decode(row.checkpoint_pointer)

    def object_key(self, key: str) -> str:
        return f"{PREFIX}/{key}"

    def listed(self, under: str = "") -> set[str]:
        client = self.server.client()
        found: set[str] = set()
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=f"{PREFIX}/{under}"
        ):
            found.update(o["Key"] for o in page.get("Contents", []))
        return found


@pytest.fixture
def deployment(
    tmp_path: Path, pg_server_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Deployment]:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        message = f"the browser half needs Debian's chromium at {CHROMIUM}"
        if _require_browser():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    with contextlib.ExitStack() as stack:
        werkzeug = logging.getLogger("werkzeug")  # moto's server: a log line per request
        stack.callback(werkzeug.setLevel, werkzeug.level)
        werkzeug.setLevel(logging.WARNING)
        server = stack.enter_context(running_s3_server())
        bucket = server.new_bucket()
        ledger_url = create_pg_database(pg_server_url)
        stack.callback(drop_pg_database, pg_server_url, ledger_url)
        dagster_db, dagster_url = create_database(pg_server_url, "tm_dagster")
        stack.callback(drop_database, pg_server_url, dagster_db)
        # The shipped instance config, verbatim: its storage URL comes from DAGSTER_PG_URL.
        pg_url = dagster_url.replace("postgresql+psycopg://", "postgresql+psycopg2://")
        monkeypatch.setenv("DAGSTER_PG_URL", pg_url)
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in ENV_NAMES.values()
            and not k.startswith("AWS_")
            and k not in ("DAGSTER_HOME", "STORYBOARD_DEFS")
        }
        python_path = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
        base.update(
            {
                **server.env(SECRET),
                "PYTHONPATH": python_path.rstrip(os.pathsep),
                "DAGSTER_PG_URL": pg_url,
                "PIPELINE_DB_URL": ledger_url,
                "PIPELINE_STORAGE_URL": f"s3://{bucket}/{PREFIX}",
                "PIPELINE_LEASE_SECONDS": str(LEASE_SECONDS),
                "PIPELINE_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
            }
        )
        machines = []
        for name in ("a", "b", "c"):
            root = tmp_path / f"machine-{name}"
            (root / "home").mkdir(parents=True)
            (root / "dagster_home").mkdir()
            shutil.copyfile(
                ROOT / "deploy" / "dagster.yaml", root / "dagster_home" / "dagster.yaml"
            )
            env = {
                **base,
                "PIPELINE_HOME": str(root / "home"),
                "DAGSTER_HOME": str(root / "dagster_home"),
            }
            machines.append(Machine(name, root, env))
        a, b, c = machines
        # A's sensor scrubs every episode each tick (the default period is an hour).
        a.env["PIPELINE_SCRUB_PERIOD_SECONDS"] = "1"
        b.env["PIPELINE_OFFLINE_LATENCY_MS"] = str(LATENCY_MS)
        observer = tmp_path / "observer_dagster_home"  # the test's own view of the instance
        observer.mkdir()
        shutil.copyfile(ROOT / "deploy" / "dagster.yaml", observer / "dagster.yaml")
        instance = dg.DagsterInstance.from_config(str(observer))
        stack.callback(instance.dispose)
        shots, logs = tmp_path / "screenshots", tmp_path / "logs"
        shots.mkdir()
        logs.mkdir()
        deployment = Deployment(server, bucket, ledger_url, instance, a, b, c, shots, logs)
        try:
            yield deployment
        finally:
            for process in deployment.started:  # our own process groups only
                stop(process)
            engine_for(ledger_url).dispose()
            print(f"logs: {logs}\nscreenshots: {shots}")


def wait_for(
    what: str, predicate: Callable[[], Any], timeout: float, log: Path | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}\n{log_tail(log) if log else ''}"
    )


def own_calls(ledger: LedgerStore, run_id: str) -> dict[str, int]:
    """Provider calls of one run, by step."""
    counts: dict[str, int] = {}
    for call in ledger.provider_calls(episode=EPISODE):
        if str(call["run_id"]).split(":", 1)[0] == run_id:
            counts[call["step_id"]] = counts.get(call["step_id"], 0) + 1
    return counts


# ----------------------------------------------------------------------------------- phases
def start_machine_a(d: Deployment) -> tuple[str, subprocess.Popen[bytes], Path]:
    """``dagster dev`` on machine A, started now, waited for later (it loads while B runs)."""
    workspace = write_workspace(
        d.a.root / "workspace.yaml", "three_machines_location", "defs", LOCATION, TESTS_DIR
    )
    port = free_port()
    log = d.logs / "a-dagster-dev.log"
    dagster = str(Path(sys.executable).with_name("dagster"))
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [dagster, "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port)],
            cwd=d.a.root,
            env=d.a.env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as one
        )
    d.started.append(process)
    return f"http://127.0.0.1:{port}", process, log


def machine_b_killed_mid_step(d: Deployment) -> tuple[set[str], str, str]:
    """B adds the episode and materializes it slowly; SIGKILL while a step runs.

    Returns (steps B completed, the killed step, B's run id)."""
    added = d.b.storyboard(
        "add-episode", "--project", "demo", "--episode", "ep01",
        "--story", str(sample_stories()["ep01"]),
    )  # fmt: skip
    assert added["ok"] and added["partition_registered"] == "added", added
    inputs = d.listed("projects/")
    assert {d.object_key("projects/demo/project.yaml"),
            d.object_key("projects/demo/episodes/ep01/story.md")} <= inputs  # fmt: skip

    log = d.logs / "b-materialize.log"
    process = d.b.spawn("materialize", "--partition", PARTITION, log=log)
    d.started.append(process)
    ledger = d.ledger

    def mid_step() -> tuple[str, str, int] | None:
        """(step, run id, call id) once two steps are done and a model call of the running
        step is in flight (recorded, not finished: it sleeps LATENCY_MS, far longer than
        the few milliseconds from this look to the kill)."""
        assert process.poll() is None, f"B ended before the kill:\n{log_tail(log)}"
        rows = d.rows()
        done = [s for s, r in rows.items() if str(r.status) == "completed"]
        running = [(s, r) for s, r in rows.items() if str(r.status) == "running"]
        if len(done) < 2 or not running:
            return None
        step_id, row = running[0]
        run_id = str(row.run_id).split(":", 1)[0]
        calls = [
            c for c in ledger.provider_calls(EPISODE.step(step_id))
            if str(c["run_id"]).split(":", 1)[0] == run_id
        ]  # fmt: skip
        finished = [c for c in calls if c["finished_at"] is not None]
        in_flight = [c for c in calls if c["finished_at"] is None]
        if finished and in_flight:  # work done in this step, and more under way
            return step_id, run_id, int(in_flight[-1]["id"])
        return None

    killed, run_id, call_id = wait_for("B inside a step, two steps done", mid_step, 180, log)
    os.killpg(os.getpgid(process.pid), signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    # What the kill left: the row running under B's run, which nobody renews any more,
    # and the model call it was inside, never finished.
    rows = d.rows()
    assert str(rows[killed].status) == "running", rows[killed]
    assert str(rows[killed].run_id).startswith(run_id), rows[killed]
    cut = [c for c in ledger.provider_calls(EPISODE.step(killed)) if c["id"] == call_id]
    assert len(cut) == 1 and cut[0]["finished_at"] is None, cut
    done = {s for s, r in rows.items() if str(r.status) == "completed"}
    assert len(done) >= 2 and {str(r.status) for r in rows.values()} == {"completed", "running"}
    run = d.instance.get_run_by_id(run_id)
    assert run is not None and run.tags.get("dagster/partition") == PARTITION  # shared instance
    return done, killed, run_id


def machine_c_resumes(d: Deployment, done: set[str], killed: str, b_run: str) -> str:
    """C waits out B's lease and materializes: B's work is kept, the killed step recovered."""

    def lease_lapsed() -> bool:
        row = d.rows()[killed]
        beat = parse_timestamp(row.heartbeat_at) or parse_timestamp(row.started_at)
        assert beat is not None, row
        return (datetime.now(UTC) - beat).total_seconds() > LEASE_SECONDS + 1

    wait_for("B's lease to lapse", lease_lapsed, LEASE_SECONDS + 60)
    report = d.c.storyboard("materialize", "--partition", PARTITION, timeout=600)
    assert report["ok"] and report["dagster_status"] == "SUCCESS", report
    c_run = str(report["run_id"])
    steps = {s["step"]: s for s in report["steps"]}
    assert list(steps) == STEP_IDS
    for step_id in done:  # finished by B: skipped, no model call
        assert (steps[step_id]["decision"], steps[step_id]["provider_calls"]) == ("skip", 0), steps
    assert steps[killed]["decision"] == "stale_running_recovery", steps[killed]
    assert steps[killed]["provider_calls"] > 0
    for step_id in set(STEP_IDS) - done:
        assert steps[step_id]["outcome"] == "materialized", steps[step_id]
    rows = d.rows()
    assert {s: str(r.status) for s, r in rows.items()} == dict.fromkeys(STEP_IDS, "completed")
    assert str(rows[killed].run_id).startswith(c_run)  # taken over by C
    calls = own_calls(d.ledger, c_run)
    assert not set(calls) & done and killed in calls, calls
    assert set(own_calls(d.ledger, b_run)) <= done | {killed}
    return c_run


def the_killed_run_was_ended_by_the_takeover(d: Deployment, b_run: str, c_run: str) -> None:
    """B's Dagster run, which nothing else ends: B's process was SIGKILLed, and run
    monitoring cannot check an in-process CLI run (DefaultRunLauncher has no worker health
    check). C's claim of the lapsed lease ends it (marked failed, naming C's run): left
    STARTED, under deploy/dagster.yaml's one-run-per-episode limit (``tag_concurrency_limits``
    on ``dagster/partition``) it would keep every queued run of the episode, the sensor's
    relaunch below included, waiting for ever."""
    run = d.instance.get_run_by_id(b_run)
    assert run is not None and run.status == dg.DagsterRunStatus.FAILURE, run
    failures = d.instance.all_logs(b_run, of_type=dg.DagsterEventType.RUN_FAILURE)
    assert any(c_run in str(e.message) for e in failures), [e.message for e in failures]


def sensor_ticks(url: str) -> list[dict[str, Any]]:
    data = graphql(url, TICKS_QUERY, {"selector": SENSOR_SELECTOR})["sensorOrError"]
    assert data["__typename"] == "Sensor", data
    return list(data["sensorState"]["ticks"])


def sensor_runs(d: Deployment) -> list[dg.DagsterRun]:
    runs = d.instance.get_runs(dg.RunsFilter(tags={"dagster/partition": PARTITION}))
    return [r for r in runs if r.tags.get("dagster/sensor_name") == "resume_sensor"]


def step_runs(d: Deployment) -> list[dg.DagsterRun]:
    """The sensor's runs of steps (block reports run in ``resume_report``)."""
    return [r for r in sensor_runs(d) if r.job_name != "resume_report"]


def failures(d: Deployment, run_id: str) -> str:
    """What a failed run says about its failure (for an assertion message)."""
    said = []
    for entry in d.instance.all_logs(run_id):
        event = entry.dagster_event
        if event is not None and event.event_type_value in ("STEP_FAILURE", "RUN_FAILURE"):
            said.append(f"{event.event_type_value} {event.step_key}: {event.message}")
            info = getattr(event.event_specific_data, "error", None)
            if info is not None:
                said.append(str(info.to_string())[-3000:])
    return "\n".join(said)


def integrity_check(d: Deployment, step_id: str) -> Any:
    key = dg.AssetCheckKey(dg.AssetKey(step_id), "resume_integrity")
    records = d.instance.event_log_storage.get_asset_check_execution_history(key, limit=50)
    mine = [r for r in records if r.partition == PARTITION and r.evaluation is not None]
    return mine[0] if mine else None


# ------------------------------------------------------------------------------------ test
def test_three_machines_share_only_postgres_and_the_bucket(deployment: Deployment) -> None:
    d = deployment
    url, a_process, a_log = start_machine_a(d)

    done, killed, b_run = machine_b_killed_mid_step(d)
    c_run = machine_c_resumes(d, done, killed, b_run)
    print(f"B ({b_run}) killed in {killed} after {sorted(done)}; C ({c_run}) resumed")

    # Machine A: the UI and the daemon up.
    wait_until_loaded(url, a_process, a_log)
    the_killed_run_was_ended_by_the_takeover(d, b_run, c_run)
    # The sensor turned on.
    started = graphql(url, START_SENSOR, {"selector": SENSOR_SELECTOR})["startSensor"]
    assert started["__typename"] == "Sensor", started

    def watch(what: str, predicate: Callable[[], Any], timeout: float = 180) -> Any:
        def checked() -> Any:
            assert a_process.poll() is None, f"dagster dev exited:\n{log_tail(a_log)}"
            failed = [t["error"] for t in sensor_ticks(url) if t["status"] == "FAILURE"]
            assert not failed, f"a sensor tick failed while waiting for {what}: {failed[:2]}"
            return predicate()

        return wait_for(what, checked, timeout, a_log)

    # Its first ticks judge the episode from the ledger's seals: nothing to do.
    watch("two sensor ticks", lambda: len(sensor_ticks(url)) >= 2)
    assert step_runs(d) == []

    # A picture deleted from the bucket: found by the scrub, relaunched self-only.
    ref = d.manifest("ref_image_gen")
    relative, picture = sorted(ref.artifacts.items())[0]
    d.server.client().delete_object(Bucket=d.bucket, Key=d.object_key(picture.key))
    relaunched = watch(
        "the sensor's relaunch of ref_image_gen",
        lambda: [r for r in step_runs(d) if r.status.value in TERMINAL],
        timeout=240,
    )
    (run,) = step_runs(d)
    assert relaunched == [run]
    assert run.status == dg.DagsterRunStatus.SUCCESS, failures(d, run.run_id)
    assert run.asset_selection == {dg.AssetKey("ref_image_gen")}  # self-only
    assert run.tags["resume/action"] == "rerun_self", run.tags
    assert relative in run.tags["resume/reason"], run.tags
    row = d.rows()["ref_image_gen"]
    assert str(row.status) == "completed" and str(row.run_id).startswith(run.run_id)
    redrawn = d.manifest("ref_image_gen").artifacts[relative]
    assert redrawn.key != picture.key and redrawn.sha256 == picture.sha256
    assert d.object_key(redrawn.key) in d.listed()
    assert own_calls(d.ledger, run.run_id) == {"ref_image_gen": 1}  # only the lost picture
    print(f"sensor relaunch {run.run_id}: {relative} redrawn as {redrawn.key}")

    # An envelope overwritten in the bucket: a block, reported as a failed check.
    envelope = d.manifest("entity_canon").envelope
    client = d.server.client()
    raw = json.loads(
        client.get_object(Bucket=d.bucket, Key=d.object_key(envelope.key))["Body"].read()
    )
    raw["data"]["edited in the bucket"] = True
    client.put_object(
        Bucket=d.bucket, Key=d.object_key(envelope.key), Body=json.dumps(raw).encode()
    )
    blocked = watch(
        "the block of entity_canon",
        lambda: (
            (r := integrity_check(d, "entity_canon")) is not None
            and r.status.value == "FAILED"
            and r
        ),
    )
    metadata = blocked.evaluation.metadata
    assert envelope.key in metadata["reason"].value, metadata  # names the object
    # An edited envelope is a hand edit (resources/checkpoints/bucket.py): accept or force.
    assert metadata["origin"].value == "invariant_drift", metadata
    assert f"storyboard force --partition {PARTITION} --step entity_canon" in (
        metadata["what_to_do"].value
    )
    assert [r.asset_selection for r in step_runs(d)] == [{dg.AssetKey("ref_image_gen")}]
    assert str(d.rows()["entity_canon"].status) == "completed"  # a block writes no row

    see_block_in_browser(d, url, envelope.key)

    stop(a_process)
    only_scratch_in_homes(d)


def see_block_in_browser(d: Deployment, url: str, envelope_key: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.set_default_timeout(60_000)
        try:
            page.goto(f"{url}/assets/entity_canon?view=checks")
            expect(page.get_by_text("what_to_do")).to_be_visible()
            assert page.get_by_text("Join the Dagster community").count() == 0
            body = page.inner_text("body")
            assert PARTITION in body
            assert envelope_key in body, body[-3000:]
            page.screenshot(path=str(d.shots / SCREENSHOT))
        finally:
            browser.close()


def only_scratch_in_homes(d: Deployment) -> None:
    """Each home holds the per-process scratch and the inputs' cache, nothing else."""
    client = d.server.client()
    for machine in d.machines:
        home = machine.home
        top = {p.name for p in home.iterdir()}
        assert top <= {SCRATCH_DIR, "projects"}, (machine.name, top)
        for path in home.rglob("*"):
            assert ".sqlite3" not in path.name, (machine.name, path)  # no ledger, anywhere
            parts = path.relative_to(home).parts
            if parts[0] == SCRATCH_DIR:
                continue
            assert "checkpoints" not in parts, (machine.name, path)
            if path.is_file():  # an input, as published
                key = d.object_key(path.relative_to(home).as_posix())
                published = client.get_object(Bucket=d.bucket, Key=key)["Body"].read()
                assert path.read_bytes() == published, (machine.name, path)
