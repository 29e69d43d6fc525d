"""The fleet on the real engine: dagster-celery workers that share only PostgreSQL and a bucket.

Three ``storyboard worker`` processes, each with its own empty ``PIPELINE_HOME`` and its own
working directory, take steps from one queue on the machine's RabbitMQ (results through
Redis). They share the ledger (a PostgreSQL database), the Dagster instance (another one,
the shipped ``deploy/dagster.yaml``) and a moto bucket; the launcher is a fourth home that
runs ``storyboard materialize`` with ``PIPELINE_EXECUTOR=celery``.

- A clean run of an episode completes with its steps spread over more than one worker and
  the provider calls, step by step, of the same episode run in one process.
- A worker SIGKILLed while a step of another episode waits on a model call: the broker
  delivers the task again (``acks_late``) to another worker, whose claim is refused by the
  dead worker's live lease without a model call, and the run fails. The resume sensor
  (``dagster dev``'s daemon, on the shipped instance config) then recovers the step in a run
  of its own whose steps run on the surviving workers. The episode costs at most a clean run
  plus the call that was in flight.
- A worker that never saw an episode runs its SKIP path with no call.
- The broker's password never reaches the run storage.
- A one-minute outage of the bucket while a paid step is between its model calls costs no
  call: the step waits it out, its lease renewed, and publishes once the bucket is back.
- A worker killed after k of a step's n replies (``PIPELINE_CRASH_AT=<step>:replied.<k>``):
  the sensor recovers the step on a worker of an empty home, which takes the k replies back
  from the journal of paid replies in the bucket and pays the n - k it never got.
- A spend cap hit inside an image step, then raised: the resume, on another worker, pays
  only what the capped claim had not; the episode costs a clean run's calls exactly.
"""

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from cli_helpers import ROOT, TESTS_DIR
from dagster_dev import (
    create_database,
    drop_database,
    log_tail,
    start_dagster_dev,
    start_sensor,
    stop,
    wait_until_loaded,
    write_workspace,
)
from fleet_support import BACKEND_URL, delete_queue
from s3_server import SECRET, running_s3_server
from storyboard_support import create_pg_database, drop_pg_database
from tcp_proxy import TcpProxy

from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.fleet_settings import FLEET_ENV_NAMES
from pipeline_defs.resume.partition import Episode
from pipeline_defs.resume.settings import ENV_NAMES
from pipeline_defs.resume.status import LedgerRow, StepStatus
from pipeline_defs.storyboard import STORYBOARD_STEPS, sample_stories
from resources.ledger.store import LedgerStore, engine_for
from resources.pipeline import ledger_for
from resources.storage.retry_budget import RetryBudget

pytestmark = [pytest.mark.pg, pytest.mark.xdist_group("fleet")]

PREFIX = "fleet"
LOCATION = "fleet"
CLEAN = Episode.parse("demo/ep01")
KILLED = Episode.parse("demo/ep02")
LEASE_SECONDS = 10
HEARTBEAT_SECONDS = 2
LATENCY_MS = 700  # per model call: the kill lands while a step waits on one
# The password the broker URL carries: it must never reach Dagster's run storage.
BROKER_PASSWORD = "guest"


@dataclass
class Home:
    """One machine: its own empty PIPELINE_HOME and working directory, and its env."""

    name: str
    root: Path
    env: dict[str, str]

    def command(self, *args: str) -> list[str]:
        return [str(Path(sys.executable).with_name("storyboard")), *args]

    def run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args),
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def storyboard(self, *args: str, timeout: float = 600) -> dict[str, Any]:
        """``storyboard ARGS --json``; its payload (exit 0 required)."""
        done = self.run(*args, "--json", timeout=timeout)
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
class Worker:
    home: Home
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def node(self) -> str:
        """The Celery node name ``storyboard worker`` gives itself."""
        return f"storyboard-{self.process.pid}@"

    def owns(self, pid: int) -> bool:
        """``pid`` is this worker or one of its pool processes."""
        if pid == self.process.pid:
            return True
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            return int(stat.rsplit(")", 1)[1].split()[1]) == self.process.pid
        return False


@dataclass
class Fleet:
    ledger_url: str
    dagster_url: str
    instance: dg.DagsterInstance
    launcher: Home
    base: dict[str, str]
    root: Path
    logs: Path
    url: str
    dagster_dev: subprocess.Popen[bytes]
    workers: list[Worker] = field(default_factory=list)
    daemon_proxies: tuple[TcpProxy, ...] = ()  # the daemon's broker and result backend

    @property
    def ledger(self) -> LedgerStore:
        return ledger_for(self.ledger_url)

    def rows(self, episode: Episode) -> dict[str, LedgerRow]:
        return {k.step_id: r for k, r in self.ledger.get_many(episodes=[episode]).items()}

    def calls(self, episode: Episode) -> list[dict[str, Any]]:
        return self.ledger.provider_calls(episode=episode)

    def add_episodes(self, story: Path, *episodes: Episode) -> None:
        """Migrate the ledger and register ``episodes``, each with ``story``, from the
        launcher's home."""
        self.launcher.storyboard("migrate")
        for episode in episodes:
            self.launcher.storyboard(
                "add-episode", "--project", episode.project_id, "--episode",
                episode.episode_id, "--story", str(story),
            )  # fmt: skip

    def start_worker(self, name: str, **env: str) -> Worker:
        """A worker of its own home; ``env``: variables of this worker only (its broker URL
        through a proxy the test cuts)."""
        root = self.root / f"worker-{name}"
        (root / "home").mkdir(parents=True)
        home = Home(name, root, {**self.base, "PIPELINE_HOME": str(root / "home"), **env})
        log = self.logs / f"worker-{name}.log"
        worker = Worker(home, home.spawn("worker", "--concurrency", "1", log=log), log)
        self.workers.append(worker)
        wait_for(f"worker {name} ready", lambda: " ready." in log_tail(worker.log), 120, log)
        return worker

    def worker_of(self, owner: str) -> Worker:
        pid = int(owner.rsplit(":", 1)[1])
        found = [w for w in self.workers if w.owns(pid)]
        assert len(found) == 1, (owner, [w.process.pid for w in self.workers])
        return found[0]

    def executed_by(self, run_id: str) -> dict[str, list[str]]:
        """Per step, the Celery nodes Dagster recorded executing it, in order."""
        nodes: dict[str, list[str]] = {}
        for entry in self.instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
            event = entry.dagster_event
            if event is None or "in celery worker" not in (event.message or ""):
                continue
            metadata = event.engine_event_data.metadata
            node = str(metadata["Celery worker"].value)
            nodes.setdefault(str(entry.step_key), []).append(node)
        return nodes


def _port(url: str) -> int:
    """The port of a broker or backend URL (``scheme://…@host:port/…``)."""
    return int(url.split("://", 1)[1].split("@")[-1].split("/", 1)[0].rsplit(":", 1)[1])


def _via(url: str, proxy: TcpProxy) -> str:
    """``url`` through ``proxy``: the same URL on the proxy's port."""
    port = _port(url)
    return url.replace(f":{port}/", f":{proxy.port}/", 1)


def wait_for(
    what: str, predicate: Callable[[], Any], timeout: float, log: Path | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}\n{log_tail(log) if log else ''}"
    )


def stop_group(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Stop a process group we started (a worker and its pool), by its pid only."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # pool processes that outlived their parent


@pytest.fixture
def fleet(
    tmp_path: Path, pg_server_url: str, celery_broker: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Fleet]:
    queue = f"storyboard-test-{uuid.uuid4().hex[:10]}"
    with contextlib.ExitStack() as stack:
        werkzeug = logging.getLogger("werkzeug")  # moto's server: a log line per request
        stack.callback(werkzeug.setLevel, werkzeug.level)
        werkzeug.setLevel(logging.WARNING)
        server = stack.enter_context(running_s3_server())
        bucket = server.new_bucket()
        ledger_url = create_pg_database(pg_server_url)
        stack.callback(drop_pg_database, pg_server_url, ledger_url)
        stack.callback(lambda: engine_for(ledger_url).dispose())
        dagster_db, dagster_url = create_database(pg_server_url, "fleet_dagster")
        stack.callback(drop_database, pg_server_url, dagster_db)
        stack.callback(delete_queue, celery_broker, queue)
        pg_url = dagster_url.replace("postgresql+psycopg://", "postgresql+psycopg2://")
        monkeypatch.setenv("DAGSTER_PG_URL", pg_url)  # the test's own view of the instance
        dagster_home = tmp_path / "dagster_home"  # the shipped instance config, verbatim
        dagster_home.mkdir()
        shutil.copyfile(ROOT / "deploy" / "dagster.yaml", dagster_home / "dagster.yaml")
        python_path = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
        base = {
            k: v
            for k, v in os.environ.items()
            if k not in ENV_NAMES.values()
            and k not in FLEET_ENV_NAMES
            and not k.startswith("AWS_")
            and k not in ("STORYBOARD_DEFS", "PIPELINE_CRASH_AT")
        }
        base.update(
            {
                **server.env(SECRET),
                "PYTHONPATH": python_path.rstrip(os.pathsep),
                "DAGSTER_HOME": str(dagster_home),
                "DAGSTER_PG_URL": pg_url,
                "PIPELINE_DB_URL": ledger_url,
                "PIPELINE_STORAGE_URL": f"s3://{bucket}/{PREFIX}",
                "PIPELINE_LEASE_SECONDS": str(LEASE_SECONDS),
                "PIPELINE_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
                "PIPELINE_EXECUTOR": "celery",
                "PIPELINE_CELERY_BROKER_URL": celery_broker,
                "PIPELINE_CELERY_QUEUE": queue,
            }
        )
        logs = tmp_path / "logs"
        logs.mkdir()
        (tmp_path / "launcher" / "home").mkdir(parents=True)
        launcher = Home(
            "launcher",
            tmp_path / "launcher",
            {**base, "PIPELINE_HOME": str(tmp_path / "launcher" / "home")},
        )
        instance = dg.DagsterInstance.from_config(str(dagster_home))
        stack.callback(instance.dispose)
        # The UI and the daemon, on the fleet's location: loading while the workers run.
        (tmp_path / "daemon" / "home").mkdir(parents=True)
        workspace = write_workspace(
            tmp_path / "daemon" / "workspace.yaml", "fleet_location", "defs", LOCATION, TESTS_DIR
        )
        # The daemon's runs (their coordinators) reach the broker and the result backend
        # through proxies a test may cut: an outage of both, as the sensor's runs see it.
        broker_port = _port(celery_broker)
        broker_proxy = stack.enter_context(TcpProxy(broker_port))
        backend_proxy = stack.enter_context(TcpProxy(_port(BACKEND_URL)))
        daemon_env = {
            **base,
            "PIPELINE_HOME": str(tmp_path / "daemon" / "home"),
            "PIPELINE_CELERY_BROKER_URL": _via(celery_broker, broker_proxy),
            "PIPELINE_CELERY_BACKEND_URL": _via(BACKEND_URL, backend_proxy),
        }
        url, process = start_dagster_dev(
            workspace, daemon_env, tmp_path / "daemon", logs / "dagster-dev.log"
        )
        stack.callback(stop, process)
        fleet = Fleet(ledger_url, pg_url, instance, launcher, base, tmp_path, logs, url, process)
        fleet.daemon_proxies = (broker_proxy, backend_proxy)
        try:
            yield fleet
        finally:
            for worker in fleet.workers:  # our own process groups only
                stop_group(worker.process)
            print(f"logs: {logs}")


def in_one_process(tmp_path: Path, story: Path) -> dict[str, int]:
    """Provider calls per step of ``CLEAN``'s story run in one process (SQLite, a disk)."""
    home = tmp_path / "reference"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ENV_NAMES.values() and k not in FLEET_ENV_NAMES and k != "STORYBOARD_DEFS"
    }
    env.update({"PIPELINE_HOME": str(home / "pipeline"), "DAGSTER_HOME": str(home / "dagster")})
    (home / "dagster").mkdir()
    reference = Home("reference", home, env)
    reference.storyboard(
        "add-episode", "--project", "demo", "--episode", "ep01", "--story", str(story)
    )
    report = reference.storyboard("materialize", "--partition", CLEAN.partition_key)
    return {s["step"]: s["provider_calls"] for s in report["steps"] if s["provider_calls"]}


def per_step(calls: list[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for call in calls:
        counts[call["step_id"]] = counts.get(call["step_id"], 0) + 1
    return counts


def test_a_fleet_of_celery_workers_shares_only_postgres_and_the_bucket(
    fleet: Fleet, tmp_path: Path
) -> None:
    story = sample_stories()["ep01"]
    reference = in_one_process(tmp_path, story)
    assert sum(reference.values()) > 0

    launcher = fleet.launcher
    launcher.storyboard("migrate")
    for episode in (CLEAN, KILLED):
        launcher.storyboard(
            "add-episode",
            "--project",
            episode.project_id,
            "--episode",
            episode.episode_id,
            "--story",
            str(story),
        )
    for name in ("w1", "w2", "w3"):
        fleet.start_worker(name)

    # 1. A clean run through Celery: every step on a worker, the calls of one process.
    report = launcher.storyboard("materialize", "--partition", CLEAN.partition_key)
    assert report["success"], report
    assert per_step(fleet.calls(CLEAN)) == reference
    executed = fleet.executed_by(report["run_id"])
    assert set(executed) == {s["step"] for s in report["steps"]}, executed
    nodes = {n for ns in executed.values() for n in ns}
    by_worker = {w.node: w for w in fleet.workers}
    used = {prefix for prefix in by_worker if any(n.startswith(prefix) for n in nodes)}
    assert len(used) > 1, f"every step ran on one worker: {executed}"
    # Who ran it: each claim names the worker process, shown by status --json.
    status = launcher.storyboard("status", "--partition", CLEAN.partition_key)
    owners = [s["worker"] for s in status["steps"]]
    assert owners and all(owners), status
    assert {fleet.worker_of(o).node for o in owners} == used

    # 2. A worker SIGKILLed while its step waits on a model call.
    for worker in fleet.workers:
        stop_group(worker.process)
    fleet.workers.clear()
    fleet.base["PIPELINE_OFFLINE_LATENCY_MS"] = str(LATENCY_MS)
    _first, _second, _third = (fleet.start_worker(n) for n in ("w4", "w5", "w6"))
    run_log = fleet.logs / "killed-run.log"
    launch = launcher.spawn(
        "materialize", "--partition", KILLED.partition_key, "--json", log=run_log
    )

    def in_flight() -> tuple[str, LedgerRow, dict[str, Any]] | None:
        rows = fleet.rows(KILLED)
        for call in fleet.calls(KILLED):
            row = rows.get(call["step_id"])
            if call["finished_at"] is None and row is not None and row.status is StepStatus.RUNNING:
                return call["step_id"], row, call
        return None

    step_id, row, call = wait_for("a step waiting on a model call", in_flight, 240, run_log)
    assert row.lock_owner is not None
    victim = fleet.worker_of(row.lock_owner)
    os.killpg(victim.process.pid, signal.SIGKILL)
    victim.process.wait(timeout=30)
    calls_at_kill = len(fleet.calls(KILLED))

    # The broker hands the task to another worker: refused by the live lease, no call.
    assert launch.wait(timeout=240) != 0, log_tail(run_log)
    killed_run = json.loads(_json_of(run_log))
    refused = next(s for s in killed_run["steps"] if s["step"] == step_id)
    redelivered = fleet.executed_by(killed_run["run_id"]).get(step_id, [])
    survivors = [w for w in fleet.workers if w is not victim]
    assert len(redelivered) == 2 and redelivered[0].startswith(victim.node), redelivered
    assert any(redelivered[1].startswith(w.node) for w in survivors), redelivered
    assert refused["error_code"] == "step.already_running", refused
    assert len(fleet.calls(KILLED)) == calls_at_kill, "a refused delivery spent a call"
    cut = [c for c in fleet.calls(KILLED) if c["id"] == call["id"]]
    assert cut and cut[0]["finished_at"] is None  # the call in flight: outcome unknown

    # The resume sensor recovers the step in a run of its own, on the surviving workers.
    wait_until_loaded(fleet.url, fleet.dagster_dev, fleet.logs / "dagster-dev.log")
    start_sensor(fleet.url, LOCATION)

    def recovery() -> dg.DagsterRun | None:
        runs = fleet.instance.get_runs(
            dg.RunsFilter(tags={"dagster/partition": KILLED.partition_key})
        )
        done = [
            r
            for r in runs
            if r.tags.get("dagster/sensor_name") == "resume_sensor"
            and r.job_name != "resume_report"
            and r.status.value in ("SUCCESS", "FAILURE", "CANCELED")
        ]
        return done[0] if done else None

    run = wait_for("the sensor's recovery run", recovery, 300, fleet.logs / "dagster-dev.log")
    assert run.status == dg.DagsterRunStatus.SUCCESS, run.run_id
    assert dg.AssetKey(step_id) in (run.asset_selection or set()), run.asset_selection
    assert fleet.rows(KILLED)[step_id].status is StepStatus.COMPLETED
    recovered_on = fleet.executed_by(run.run_id)
    assert step_id in recovered_on, recovered_on
    assert all(
        any(node.startswith(w.node) for w in survivors)
        for nodes in recovered_on.values()
        for node in nodes
    ), recovered_on
    takeover = [
        t
        for t in fleet.ledger.transitions()
        if (t.episode_id, t.step_id) == (KILLED.episode_id, step_id)
        and str(t.run_id).startswith(run.run_id)
    ]
    assert any(
        str(t.action) == "stale_running_recovery" or "recover" in str(t.reason) for t in takeover
    ), takeover
    total = len(fleet.calls(KILLED))
    assert total <= sum(reference.values()) + 1, (total, reference)

    # 3. The SKIP path on a worker that never saw the episode: no call.
    for worker in survivors:
        stop_group(worker.process)
    fleet.workers.clear()
    fresh = fleet.start_worker("fresh")
    before = len(fleet.calls(CLEAN))
    again = launcher.storyboard("materialize", "--partition", CLEAN.partition_key)
    assert again["success"], again
    assert {s["decision"] for s in again["steps"]} == {"skip"}, again["steps"]
    assert len(fleet.calls(CLEAN)) == before
    nodes = {n for ns in fleet.executed_by(again["run_id"]).values() for n in ns}
    assert nodes and all(n.startswith(fresh.node) for n in nodes), nodes

    # The broker's password is in no run, event or tag of the instance.
    engine = sa.create_engine(fleet.dagster_url)
    try:
        with engine.connect() as conn:
            for table, column in (
                ("runs", "run_body"),
                ("event_logs", "event"),
                ("run_tags", "value"),
            ):
                found = conn.execute(
                    sa.text(f"SELECT count(*) FROM {table} WHERE {column} LIKE :secret"),
                    {"secret": f"%:{BROKER_PASSWORD}@%"},
                ).scalar_one()
                assert found == 0, f"the broker password is in {table}"
    finally:
        engine.dispose()


def _json_of(log: Path) -> str:
    """The JSON payload ``storyboard … --json`` printed on stdout among stderr lines."""
    text = log.read_text()
    start = text.index("{")
    return text[start : text.rindex("}") + 1]


PAUSED = Episode.parse("demo/ep03")


def _pid(owner: str | None) -> int:
    assert owner is not None
    return int(owner.rsplit(":", 1)[1])


def test_a_worker_paused_past_its_lease_and_delivered_again_spends_and_writes_nothing(
    fleet: Fleet, tmp_path: Path, celery_broker: str
) -> None:
    """A claim is owned by its delivery (docs/DESIGN.md#claim-tokens), on real processes.

    A worker reaches the broker through a proxy. While one of its steps waits on a model call
    with more calls to come, it is SIGSTOPped; once its lease has lapsed the proxy is cut, so
    the broker delivers the task again, in the same run, to a second worker, which takes the
    row over. The first worker is then resumed: before, its claim token (``<run>:<retry>``)
    was the redelivery's too, so its lease and call records still matched and it paid for
    the rest of the step again and wrote a second ``finish``. Now it makes no call and no
    ledger write, and the episode costs at most a clean run plus the call in flight.
    """
    story = sample_stories()["ep01"]
    reference = in_one_process(tmp_path, story)
    launcher = fleet.launcher
    fleet.add_episodes(story, PAUSED)
    fleet.base["PIPELINE_OFFLINE_LATENCY_MS"] = str(LATENCY_MS)
    broker_port = int(celery_broker.rsplit(":", 1)[1].split("/", 1)[0])
    proxy = TcpProxy(broker_port).start()
    try:
        proxied = celery_broker.replace(f":{broker_port}/", f":{proxy.port}/")
        paused = fleet.start_worker("paused", PIPELINE_CELERY_BROKER_URL=proxied)
        run_log = fleet.logs / "paused-run.log"
        launch = launcher.spawn(
            "materialize", "--partition", PAUSED.partition_key, "--json", log=run_log
        )

        def in_flight_with_more_to_come() -> tuple[str, LedgerRow] | None:
            rows, calls = fleet.rows(PAUSED), fleet.calls(PAUSED)
            for call in calls:
                step = call["step_id"]
                row = rows.get(step)
                if call["finished_at"] is not None or row is None:
                    continue
                made = sum(1 for c in calls if c["step_id"] == step)
                if row.status is StepStatus.RUNNING and made < reference.get(step, 0):
                    return step, row
            return None

        step_id, held = wait_for(
            "a step waiting on a call, with more to come", in_flight_with_more_to_come, 300,
            run_log,
        )  # fmt: skip
        assert paused.owns(_pid(held.lock_owner))
        os.killpg(paused.process.pid, signal.SIGSTOP)
        try:
            rescuer = fleet.start_worker("rescuer")  # straight to the broker
            lapsed_at = time.monotonic() + LEASE_SECONDS + HEARTBEAT_SECONDS
            while time.monotonic() < lapsed_at:
                time.sleep(0.5)
            row = fleet.rows(PAUSED)[step_id]
            assert row.run_id == held.run_id and row.heartbeat_at == held.heartbeat_at, row
            paid_at_pause = [c["id"] for c in fleet.calls(PAUSED) if c["run_id"] == held.run_id]
            written_at_pause = [
                t.transition_seq
                for t in fleet.ledger.transitions(PAUSED.step(step_id))
                if t.run_id == held.run_id
            ]
            assert proxy.cut() > 0, "the paused worker held no connection to the broker"

            def taken_over() -> LedgerRow | None:
                now = fleet.rows(PAUSED)[step_id]
                moved = now.run_id != held.run_id or now.status is not StepStatus.RUNNING
                return now if moved else None

            taken = wait_for("the task delivered again and claimed", taken_over, 240, run_log)
            assert rescuer.owns(_pid(taken.lock_owner)), taken
        finally:
            seen = paused.log.stat().st_size
            os.killpg(paused.process.pid, signal.SIGCONT)

        def ended_after_resume() -> bool:
            with paused.log.open("rb") as log:
                log.seek(seen)
                ended = rb"Task execute_plan\[[^]]+\] (succeeded|raised)"
                return re.search(ended, log.read()) is not None

        wait_for("the resumed worker's delivery to end", ended_after_resume, 240, paused.log)
        code = launch.wait(timeout=600)
    finally:
        proxy.close()
    # The run goes on with the step its redelivery completed: the fenced delivery's result
    # is that checkpoint (a SKIP of its own), not a failure of a step that succeeded.
    assert code == 0, log_tail(run_log)
    report = json.loads(_json_of(run_log))
    assert report["success"], report

    claim = held.run_id
    assert taken.run_id is not None and claim is not None
    paid = [c["id"] for c in fleet.calls(PAUSED) if c["run_id"] == claim]
    assert paid == paid_at_pause, "the resumed worker paid for another call"
    written = [
        t.transition_seq
        for t in fleet.ledger.transitions(PAUSED.step(step_id))
        if t.run_id == claim
    ]
    assert written == written_at_pause, "the resumed worker wrote to the ledger"
    finishes = [
        t for t in fleet.ledger.transitions(PAUSED.step(step_id)) if str(t.action) == "finish"
    ]
    assert len(finishes) == 1 and finishes[0].run_id == taken.run_id, finishes
    rows = fleet.rows(PAUSED)
    assert all(r.status is StepStatus.COMPLETED for r in rows.values()), rows
    in_flight = 1
    total = len(fleet.calls(PAUSED))
    assert total <= sum(reference.values()) + in_flight, (total, reference)
    assert taken.run_id.split(":")[:2] == claim.split(":")[:2], "the same run, another delivery"
    assert taken.run_id != claim, "the redelivery claimed with the paused delivery's token"


ORPHANED = Episode.parse("demo/ep04")


def test_a_killed_coordinator_never_holds_its_episode(fleet: Fleet, tmp_path: Path) -> None:
    """Run leases (docs/DESIGN.md#run-leases), on real processes. ``storyboard materialize``
    (the run's coordinator) is SIGKILLed while a worker runs one of its steps; the worker
    finishes that step after the kill, so the dead run holds no running row. Before, nothing
    ended it: it stayed STARTED and the sensor's recovery run waited behind it in the queue
    for good. Its run lease lapses, the sensor (through ``dagster dev``'s daemon) ends it,
    and the episode completes at most a clean run's calls plus the call in flight."""
    story = sample_stories()["ep01"]
    reference = in_one_process(tmp_path, story)
    launcher = fleet.launcher
    fleet.add_episodes(story, ORPHANED)
    fleet.base["PIPELINE_OFFLINE_LATENCY_MS"] = str(LATENCY_MS)
    for name in ("w1", "w2"):
        fleet.start_worker(name)
    run_log = fleet.logs / "orphaned-run.log"
    launch = launcher.spawn(
        "materialize", "--partition", ORPHANED.partition_key, "--json", log=run_log
    )

    def working_on_a_worker() -> tuple[str, str] | None:
        for step, row in fleet.rows(ORPHANED).items():
            if row.status is StepStatus.RUNNING:
                return step, str(row.run_id or "").split(":", 1)[0]
        return None

    step_id, run_id = wait_for("a step of the run on a worker", working_on_a_worker, 300, run_log)
    os.killpg(launch.pid, signal.SIGKILL)
    launch.wait(timeout=30)
    killed_at = time.monotonic()
    wait_for(
        "the worker to finish the step after the coordinator died",
        lambda: fleet.rows(ORPHANED)[step_id].status is not StepStatus.RUNNING,
        240,
    )
    assert not [r for r in fleet.rows(ORPHANED).values() if r.status is StepStatus.RUNNING]
    dead = fleet.instance.get_run_by_id(run_id)
    assert dead is not None and dead.status is dg.DagsterRunStatus.STARTED  # nobody ended it
    assert run_id in fleet.ledger.run_leases(open_only=True)  # its lease, left open

    wait_until_loaded(fleet.url, fleet.dagster_dev, fleet.logs / "dagster-dev.log")
    start_sensor(fleet.url, LOCATION)

    settled = (StepStatus.COMPLETED, StepStatus.NOT_APPLICABLE)

    def done() -> bool:
        rows = fleet.rows(ORPHANED)
        return len(rows) == len(STORYBOARD_STEPS) and all(
            r.status in settled for r in rows.values()
        )

    daemon_log = fleet.logs / "dagster-dev.log"
    wait_for("the episode completed by the sensor's runs", done, 600, daemon_log)
    took = time.monotonic() - killed_at
    ended = fleet.instance.get_run_by_id(run_id)
    assert ended is not None and ended.status is dg.DagsterRunStatus.FAILURE, ended
    failure = [
        e
        for e in fleet.instance.all_logs(run_id)
        if e.dagster_event is not None and e.dagster_event.event_type_value == "PIPELINE_FAILURE"
    ]
    assert failure and "stopped renewing its run lease" in failure[-1].message, failure
    total = len(fleet.calls(ORPHANED))
    assert total <= sum(reference.values()) + 1, (total, reference)
    print(f"killed coordinator: episode complete {took:.0f}s after the kill")


QUEUED = [Episode.parse(f"demo/q{n}") for n in range(1, 4)]


def test_runs_queued_behind_one_worker_past_a_lease_are_never_ended(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Never end a live run (docs/DESIGN.md#run-leases): one worker, three episodes launched at
    once, so each run's steps wait in the Celery queue far longer than a lease, with the
    sensor on. Before, the sensor ended runs whose coordinator was alive and took their
    partitions for dead; now every run succeeds, no step is stolen, and each episode costs
    exactly a clean run's calls."""
    story = sample_stories()["ep01"]
    reference = in_one_process(tmp_path, story)
    launcher = fleet.launcher
    fleet.add_episodes(story, *QUEUED)
    fleet.start_worker("only")
    wait_until_loaded(fleet.url, fleet.dagster_dev, fleet.logs / "dagster-dev.log")
    start_sensor(fleet.url, LOCATION)
    launches = {
        episode: launcher.spawn(
            "materialize",
            "--partition",
            episode.partition_key,
            "--json",
            log=fleet.logs / f"{episode.episode_id}.log",
        )
        for episode in QUEUED
    }
    started = time.monotonic()
    codes = {episode: process.wait(timeout=900) for episode, process in launches.items()}
    took = time.monotonic() - started
    assert took > 2 * LEASE_SECONDS, f"the runs never waited past a lease ({took:.0f}s)"
    for episode, code in codes.items():
        log = fleet.logs / f"{episode.episode_id}.log"
        assert code == 0, log_tail(log)
        assert json.loads(_json_of(log))["success"]
        assert per_step(fleet.calls(episode)) == reference, episode
        history = [t for t in fleet.ledger.transitions() if t.episode_id == episode.episode_id]
        assert not [t for t in history if str(t.action) == "stale_running_recovery"], history
    ended_by_sensor = [
        r.run_id
        for r in fleet.instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    ]
    assert not ended_by_sensor, ended_by_sensor


OUTAGE = [Episode.parse(f"demo/o{n}") for n in range(1, 3)]
OUTAGE_SECONDS = 15


def test_a_broker_and_backend_outage_strands_no_episode(fleet: Fleet, tmp_path: Path) -> None:
    """Nothing stranded by an infrastructure failure (docs/DESIGN.md#stranded-runs). The
    sensor's runs reach RabbitMQ and Redis through proxies the test cuts for 15 s: the runs
    it launches meanwhile fail before they change anything. Before, their partitions judged
    the same, to the same run key, which Dagster launches once: "launch now" for ever with
    nothing launched. Now each is launched again after its backoff, and every episode
    completes with no operator, at a clean run's calls."""
    story = sample_stories()["ep01"]
    reference = in_one_process(tmp_path, story)
    launcher = fleet.launcher
    fleet.add_episodes(story, *OUTAGE)
    launcher.storyboard("settings", "set", "retry_backoff_seconds", "2")
    for name in ("w1", "w2"):
        fleet.start_worker(name)
    wait_until_loaded(fleet.url, fleet.dagster_dev, fleet.logs / "dagster-dev.log")
    for proxy in fleet.daemon_proxies:
        proxy.cut()
    cut_at = time.monotonic()
    start_sensor(fleet.url, LOCATION)

    def failed_runs() -> list[dg.DagsterRun]:
        return [
            r
            for r in fleet.instance.get_runs(
                dg.RunsFilter(
                    statuses=[dg.DagsterRunStatus.FAILURE],
                    tags={"dagster/sensor_name": "resume_sensor"},
                )
            )
            if r.job_name != "resume_report"
        ]

    daemon_log = fleet.logs / "dagster-dev.log"
    wait_for("a sensor run failed by the outage", failed_runs, 120, daemon_log)
    assert not [r for r in fleet.ledger.get_many().values() if r.status is StepStatus.RUNNING]
    while time.monotonic() - cut_at < OUTAGE_SECONDS:
        time.sleep(0.5)
    for proxy in fleet.daemon_proxies:
        proxy.restore()
    settled = (StepStatus.COMPLETED, StepStatus.NOT_APPLICABLE)

    def done() -> bool:
        for episode in OUTAGE:
            rows = fleet.rows(episode)
            if len(rows) < len(STORYBOARD_STEPS) or any(
                r.status not in settled for r in rows.values()
            ):
                return False
        return True

    wait_for("every episode completed after the outage", done, 600, daemon_log)
    again = [
        r
        for r in fleet.instance.get_runs(
            dg.RunsFilter(tags={"dagster/sensor_name": "resume_sensor"})
        )
        if ":again" in r.tags.get("dagster/run_key", "")
    ]
    assert again, "no launch was made again under an attempt's key"
    for episode in OUTAGE:
        assert per_step(fleet.calls(episode)) == reference, episode


STORAGE_OUTAGE = Episode.parse("demo/s1")
STORAGE_OUTAGE_SECONDS = 60
# The workers keep the shipped retry budget of a bucket storage (no count of tries, seconds
# from a request's first try), set here so that no variable of the caller's changes it.
STORAGE_BUDGET = RetryBudget()
SETTLED = (StepStatus.COMPLETED, StepStatus.NOT_APPLICABLE)


def _endpoint_port(endpoint: str) -> int:
    """The port of an ``http://host:port`` endpoint."""
    return int(endpoint.rstrip("/").rsplit(":", 1)[1])


def test_a_storage_outage_mid_step_costs_no_extra_provider_call(
    fleet: Fleet, tmp_path: Path
) -> None:
    """A storage outage is waited out, never paid for twice (the shipped retry budget of
    resources/storage/retry_budget.py, ``RetryBudget``; docs/DESIGN.md#fleet). Two workers
    reach the moto bucket through a proxy. Once a paid step has had a model call answered,
    with more to come, the proxy is cut for a minute: the step cannot publish without the
    bucket. Its lease (PostgreSQL, not behind the proxy) is renewed in both halves of the
    outage; when the bucket is back the step publishes and the run succeeds, each step at a
    clean run's calls, no step ever failed, blocked or judged drifted or tampered. A cut
    that missed the step (it published first) is made again on a later step of the run; a
    run with no step left to cut fails the test as having measured nothing."""
    assert STORAGE_BUDGET.retries is None and STORAGE_BUDGET.budget_s > STORAGE_OUTAGE_SECONDS
    story = sample_stories()["ep01"]
    reference = in_one_process(tmp_path, story)
    paid = {step for step, calls in reference.items() if calls > 1}
    assert paid, f"no step of a clean run makes more than one call: {reference}"
    launcher = fleet.launcher
    fleet.add_episodes(story, STORAGE_OUTAGE)
    fleet.base["PIPELINE_OFFLINE_LATENCY_MS"] = str(LATENCY_MS)
    with TcpProxy(_endpoint_port(fleet.base["AWS_ENDPOINT_URL"])) as bucket:
        for name in ("w1", "w2"):
            fleet.start_worker(
                name,
                AWS_ENDPOINT_URL=f"http://127.0.0.1:{bucket.port}",
                PIPELINE_STORAGE_RETRY_BUDGET_SECONDS=str(STORAGE_BUDGET.budget_s),
                PIPELINE_STORAGE_TIMEOUT_SECONDS=str(STORAGE_BUDGET.timeout_s),
                PIPELINE_STORAGE_RETRIES="",  # unset: no count
            )
        run_log = fleet.logs / "storage-outage-run.log"
        launch = launcher.spawn(
            "materialize", "--partition", STORAGE_OUTAGE.partition_key, "--json", log=run_log
        )
        tried: set[str] = set()

        def between_calls() -> tuple[str, LedgerRow] | None:
            """A paid step not cut yet, running, a call of its claim answered, more to come."""
            assert launch.poll() is None, (
                f"the run ended before the bucket was cut mid-step (steps cut too late: "
                f"{sorted(tried)}): the test measured nothing\n{log_tail(run_log)}"
            )
            rows, calls = fleet.rows(STORAGE_OUTAGE), fleet.calls(STORAGE_OUTAGE)
            for step, row in rows.items():
                if step in tried or step not in paid or row.status is not StepStatus.RUNNING:
                    continue
                made = [c for c in calls if c["step_id"] == step and c["run_id"] == row.run_id]
                answered = [c for c in made if c["finished_at"] is not None]
                if answered and len(made) < reference[step]:
                    return step, row
            return None

        while True:
            step_id, held = wait_for(
                "a paid step between its model calls", between_calls, 300, run_log
            )
            tried.add(step_id)
            bucket.cut()
            cut_at = time.monotonic()
            now = fleet.rows(STORAGE_OUTAGE)[step_id]
            if now.status is StepStatus.RUNNING and now.run_id == held.run_id:
                break  # cut before the step published: the outage lands mid-step
            bucket.restore()  # the step published first: cut a later one
        refused_at_cut = bucket.refused
        beats: tuple[set[str], set[str]] = (set(), set())  # renewals seen in each half
        while (elapsed := time.monotonic() - cut_at) < STORAGE_OUTAGE_SECONDS:
            beat = fleet.rows(STORAGE_OUTAGE)[step_id].heartbeat_at
            if beat is not None and beat != held.heartbeat_at:
                beats[int(elapsed >= STORAGE_OUTAGE_SECONDS / 2)].add(beat)
            time.sleep(0.5)
        during = fleet.rows(STORAGE_OUTAGE)[step_id]
        tried_bucket = bucket.refused - refused_at_cut
        bucket.restore()
        # The outage held the step: still running under its claim a minute later (its
        # remaining calls take seconds; only its publish needs the bucket), its workers
        # tried the bucket meanwhile, and its lease was renewed all along.
        assert during.status is StepStatus.RUNNING and during.run_id == held.run_id, (
            f"{step_id} did not wait the outage out: {during}\n{log_tail(run_log)}"
        )
        assert tried_bucket > 0, "no worker tried the bucket during the outage"
        before, after = parse_timestamp(held.heartbeat_at), parse_timestamp(during.heartbeat_at)
        assert before is not None and after is not None and after > before, (held, during)
        assert beats[0] and beats[1] - beats[0], (
            f"the lease was not renewed through the outage: {beats}"
        )
        code = launch.wait(timeout=900)
    assert code == 0, log_tail(run_log)
    report = json.loads(_json_of(run_log))
    assert report["success"], report
    rows = fleet.rows(STORAGE_OUTAGE)
    assert len(rows) == len(STORYBOARD_STEPS), rows
    assert all(r.status in SETTLED for r in rows.values()), rows
    assert per_step(fleet.calls(STORAGE_OUTAGE)) == reference
    history = [t for t in fleet.ledger.transitions() if t.episode_id == STORAGE_OUTAGE.episode_id]
    judged_wrong = [
        t
        for t in history
        if str(t.action) in ("block", "failed", "ownership_lost", "stale_running_recovery")
        or t.to_status is StepStatus.FAILED
        or t.origin in (Origin.CONTRACT_DRIFT, Origin.INVARIANT_DRIFT)
        or any(word in (t.reason or "").lower() for word in ("drift", "tamper"))
    ]
    assert not judged_wrong, judged_wrong
    finishes = [t for t in history if t.step_id == step_id and str(t.action) == "finish"]
    assert len(finishes) == 1 and finishes[0].run_id == held.run_id, finishes
    print(f"storage outage: {STORAGE_OUTAGE_SECONDS}s cut mid-{step_id}, {tried_bucket} refused")


REPLIED_KILL = Episode.parse("demo/k1")
KILLED_STEP = "scene_image_pipeline"
REPLIES_KEPT = 5  # of the step's 8 in a clean run of the sample episode


def _worker_lost(worker: Worker) -> bool:
    """The worker's log says a pool process of it died of a SIGKILL."""
    return "exited with 'signal 9 (SIGKILL)'" in worker.log.read_text(errors="replace")


def test_a_worker_killed_after_k_of_n_replies_costs_only_the_n_minus_k_it_never_got(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The journal of paid replies on the fleet (docs/DESIGN.md#reply-journal). The only worker
    runs with ``PIPELINE_CRASH_AT=scene_image_pipeline:replied.5``: the process running the
    step SIGKILLs itself right after the 5th of its 8 replies came back and was kept, so no
    call is in flight. The run fails, the row is left running under the dead claim, and that
    worker's machine is gone. The resume sensor (through ``dagster dev``'s daemon) recovers
    the step on a worker whose home is empty: it takes the 5 replies back from the journal in
    the bucket and pays for the 3 it never got, so the episode costs exactly a clean run's
    calls, step by step. Without the journal, the recovery paid all 8 again (13 calls where a
    clean run makes 8). The worker's main process outlives its pool process and fails the
    task (Celery acknowledges a task whose process was lost), so nothing is delivered again:
    the run fails, and the sensor recovers the step at once, its owner's run having ended."""
    story = sample_stories()["ep01"]
    reference = in_one_process(tmp_path, story)
    replies = reference[KILLED_STEP]
    assert replies > REPLIES_KEPT, reference
    fleet.add_episodes(story, REPLIED_KILL)
    crashing = fleet.start_worker(
        "crashing", PIPELINE_CRASH_AT=f"{KILLED_STEP}:replied.{REPLIES_KEPT}"
    )
    run_log = fleet.logs / "replied-kill-run.log"
    launch = fleet.launcher.spawn(
        "materialize", "--partition", REPLIED_KILL.partition_key, "--json", log=run_log
    )
    code = launch.wait(timeout=600)
    killed = fleet.rows(REPLIED_KILL).get(KILLED_STEP)
    # The kill landed where intended: the step's process died of its own SIGKILL with the
    # step running under its claim, 5 calls made under it, every one answered.
    assert code != 0 and killed is not None and killed.status is StepStatus.RUNNING, (
        f"the crash did not land in {KILLED_STEP}: exit {code}, row {killed}\n"
        f"{log_tail(run_log)}\n{log_tail(crashing.log)}"
    )
    assert _worker_lost(crashing), log_tail(crashing.log)
    # The worker's main process saw its pool process die and failed the task (Celery acks a
    # task whose process was lost: it is not delivered again), so the run failed naming it.
    killed_run = json.loads(_json_of(run_log))
    failure = str(killed_run["error"]["message"])
    assert "WorkerLostError" in failure and f"[{KILLED_STEP}]" in failure, failure
    lost = next(s for s in killed_run["steps"] if s["step"] == KILLED_STEP)
    assert (lost["outcome"], lost["status"], lost["provider_calls"]) == (
        "unfinished",
        "running",
        REPLIES_KEPT,
    ), lost
    killed_pid = _pid(killed.lock_owner)
    assert killed_pid != crashing.process.pid and not Path(f"/proc/{killed_pid}").exists()
    calls = fleet.calls(REPLIED_KILL)
    under_killed = [c for c in calls if c["run_id"] == killed.run_id]
    assert len(under_killed) == REPLIES_KEPT, under_killed
    assert all(c["step_id"] == KILLED_STEP and c["finished_at"] for c in under_killed)
    before_kill = {s: n for s, n in reference.items() if s != KILLED_STEP}
    assert per_step([c for c in calls if c["step_id"] != KILLED_STEP]) == before_kill
    stop_group(crashing.process, signal.SIGKILL)  # its machine is gone: idle, nothing lost
    fleet.workers.remove(crashing)

    rescuer = fleet.start_worker("rescuer")  # an empty home of its own
    wait_until_loaded(fleet.url, fleet.dagster_dev, fleet.logs / "dagster-dev.log")
    start_sensor(fleet.url, LOCATION)

    def done() -> bool:
        rows = fleet.rows(REPLIED_KILL)
        return len(rows) == len(STORYBOARD_STEPS) and all(
            r.status in SETTLED for r in rows.values()
        )

    def recovery() -> dg.DagsterRun | None:
        runs = fleet.instance.get_runs(
            dg.RunsFilter(tags={"dagster/partition": REPLIED_KILL.partition_key})
        )
        ended = [
            r
            for r in runs
            if r.tags.get("dagster/sensor_name") == "resume_sensor"
            and r.job_name != "resume_report"
            and r.status.value in ("SUCCESS", "FAILURE", "CANCELED")
        ]
        return ended[0] if ended else None

    run = wait_for("the sensor's recovery run", recovery, 600, fleet.logs / "dagster-dev.log")
    assert run.status == dg.DagsterRunStatus.SUCCESS, run.run_id
    assert done(), fleet.rows(REPLIED_KILL)
    recovered = fleet.rows(REPLIED_KILL)[KILLED_STEP]
    assert recovered.run_id is not None and recovered.run_id != killed.run_id, recovered
    calls = fleet.calls(REPLIED_KILL)
    assert per_step(calls) == reference, (per_step(calls), reference)
    under_recovery = [c for c in calls if c["run_id"] == recovered.run_id]
    assert len(under_recovery) == replies - REPLIES_KEPT, under_recovery
    assert {c["step_id"] for c in under_recovery} == {KILLED_STEP}
    # Recovered as a dead owner's step, by the sensor's run, on the worker of an empty home.
    takeover = [
        t
        for t in fleet.ledger.transitions(REPLIED_KILL.step(KILLED_STEP))
        if t.run_id == recovered.run_id
    ]
    assert [str(t.action) for t in takeover][:1] == ["stale_running_recovery"], takeover
    assert recovered.run_id.split(":", 1)[0] == run.run_id, (recovered, run.run_id)
    nodes = fleet.executed_by(run.run_id)[KILLED_STEP]
    assert nodes and all(n.startswith(rescuer.node) for n in nodes), nodes


CAPPED = Episode.parse("demo/c1")
CAPPED_STEP = "ref_image_gen"


def test_a_cap_hit_and_raised_on_the_fleet_resumes_at_exactly_a_clean_runs_calls(
    fleet: Fleet, tmp_path: Path
) -> None:
    """The spend cap on the fleet (docs/DESIGN.md#spend-cap). The episode's cap is set on the
    fleet's ledger to the clean calls of every step outside ``ref_image_gen`` and its
    downstream, plus one: the cap is hit inside ``ref_image_gen`` after its first picture at
    least (one more if ``shot_dependency_t2i``, which does not precede it, had not run), and
    the step fails ``[budget.exhausted]`` on its worker. That worker is stopped, the cap raised,
    and an operator's ``storyboard materialize`` resumes the episode on a worker of an empty
    home: the pictures paid for under the cap are taken back from the journal of paid
    replies, not paid again, and the episode costs exactly a clean run's calls, step by
    step. Without the journal, the resume on the other worker paid the capped picture again
    (``ref_image_gen``: 5 calls where a clean run makes 4)."""
    story = sample_stories()["ep01"]
    reference = in_one_process(tmp_path, story)
    downstream = {"ref_image_gen", "composite_image_gen", "scene_image_pipeline"}
    cap = sum(n for step, n in reference.items() if step not in downstream) + 1
    launcher = fleet.launcher
    fleet.add_episodes(story, CAPPED)  # at the door the cap is the default's, over the estimate
    launcher.storyboard("settings", "set", "max_calls_per_episode", str(cap))
    capper = fleet.start_worker("capper")
    hit = launcher.run("materialize", "--partition", CAPPED.partition_key, "--json")
    assert hit.returncode != 0, hit.stdout[-3000:]
    report = json.loads(hit.stdout)
    failed = {s["step"]: s for s in report["steps"] if s.get("error_code")}
    assert failed[CAPPED_STEP]["error_code"] == "budget.exhausted", report["steps"]
    assert "storyboard settings set max_calls_per_episode" in failed[CAPPED_STEP]["error"]
    nodes = fleet.executed_by(report["run_id"])[CAPPED_STEP]
    assert nodes and all(n.startswith(capper.node) for n in nodes), nodes
    capped = fleet.rows(CAPPED)[CAPPED_STEP]
    assert capped.status is StepStatus.FAILED, capped
    calls = fleet.calls(CAPPED)
    assert len(calls) == cap, calls
    under_cap = [c for c in calls if c["run_id"] == capped.run_id]
    drawn = cap - len([c for c in calls if c["step_id"] != CAPPED_STEP])
    assert len(under_cap) == drawn and 1 <= drawn < reference[CAPPED_STEP], (drawn, calls)
    assert {c["step_id"] for c in under_cap} == {CAPPED_STEP}
    assert all(c["finished_at"] for c in calls), calls
    stop_group(capper.process)
    fleet.workers.remove(capper)

    launcher.storyboard("settings", "set", "max_calls_per_episode", str(10 * cap))
    resumer = fleet.start_worker("resumer")  # an empty home of its own
    resumed = launcher.storyboard("materialize", "--partition", CAPPED.partition_key)
    assert resumed["success"], resumed
    calls = fleet.calls(CAPPED)
    assert per_step(calls) == reference, (per_step(calls), reference)
    finished = fleet.rows(CAPPED)[CAPPED_STEP]
    assert finished.status is StepStatus.COMPLETED and finished.run_id != capped.run_id
    under_resume = [c for c in calls if c["run_id"] == finished.run_id]
    assert len(under_resume) == reference[CAPPED_STEP] - drawn, under_resume
    nodes = fleet.executed_by(resumed["run_id"])[CAPPED_STEP]
    assert nodes and all(n.startswith(resumer.node) for n in nodes), nodes
    assert resumer.node != capper.node
