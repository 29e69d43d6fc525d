"""Two doors of the fleet, on real ``storyboard worker`` processes (RabbitMQ, Redis, PostgreSQL).

- A worker whose settings point at another Dagster instance than the launcher's is handed a
  step of a run its instance does not hold: the run fails ``fleet.instance_mismatch``, naming
  both instances (the one the task carries, the worker's own), passwords masked, and what
  to do; not dagster-celery's ``Could not load run``.
- A step sent to a queue no worker consumes: the run's event log warns, naming the queue and
  the command that starts a worker for it, and the run fails ``fleet.queue_unserved`` past
  ``PIPELINE_CELERY_QUEUE_WAIT_SECONDS``; a worker started after the warning serves the
  step and the run completes. ``storyboard status`` names the queue while the step waits.

Nothing here passes or fails by timing: the unserved run fails because no worker on the
broker consumes its queue (a name of its own), and the late worker is started only once the
warning is in the event log, the wait then being far longer than the test.
"""

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from cli_helpers import ROOT, TESTS_DIR
from dagster_dev import create_database, drop_database, log_tail
from fleet_support import delete_queue, stop_group
from storyboard_support import create_pg_database, drop_pg_database

from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.fleet_settings import (
    DEFAULT_QUEUE_WAIT_SECONDS,
    FLEET_ENV_NAMES,
    QUEUE_WAIT_ENV,
    UNSERVED_QUEUE_TAG,
    FleetSettings,
)
from pipeline_defs.resume.settings import ENV_NAMES
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.storyboard import sample_stories
from resources.ledger.store import engine_for
from resources.pipeline import ledger_for

pytestmark = [pytest.mark.pg, pytest.mark.xdist_group("fleet")]

PARTITION = "demo/ep01"
FIRST_STEP = "story_source"
# The Dagster database's password (PostgreSQL trusts the test's connections, so any will
# do): it must be masked wherever an instance is named.
DAGSTER_PASSWORD = "s3cretpw"


@dataclass
class Doors:
    """A launcher's environment on the shipped instance config, and the workers it starts."""

    root: Path
    env: dict[str, str]  # the launcher's (and a worker's, unless it says otherwise)
    queue: str
    ledger_url: str
    dagster_url: str  # the instance's run storage, password included
    instance: dg.DagsterInstance
    logs: Path
    workers: list[subprocess.Popen[bytes]]

    def storyboard(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [_storyboard(), *args],
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def add_episode(self) -> None:
        for args in (
            ("migrate",),
            ("add-episode", "--project", "demo", "--episode", "ep01", "--story", _story()),
        ):
            done = self.storyboard(*args)
            assert done.returncode == 0, done.stderr[-3000:]

    def spawn(self, name: str, *args: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = self.logs / f"{name}.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                [_storyboard(), *args],
                env=env,
                cwd=self.root,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.workers.append(process)
        return process

    def start_worker(self, name: str, **env: str) -> Path:
        """A ``storyboard worker`` on the queue, ready; ``env``: its own variables."""
        self.spawn(name, "worker", "--concurrency", "1", env={**self.env, **env})
        log = self.logs / f"{name}.log"
        wait_for(f"worker {name} ready", lambda: " ready." in log_tail(log), 120, log)
        return log

    def the_run(self) -> dg.DagsterRun | None:
        runs = self.instance.get_runs()
        assert len(runs) <= 1, [r.run_id for r in runs]
        return runs[0] if runs else None

    def warnings(self, run_id: str, level: int = logging.WARNING) -> list[str]:
        """The run's log lines (not Dagster's events) at ``level`` or above."""
        return [
            e.user_message
            for e in self.instance.all_logs(run_id)
            if _level(e.level) >= level and e.dagster_event is None
        ]

    def failure(self, run_id: str) -> Any:
        """The run's failure (its serialized error), asserted present."""
        failures = self.instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        assert len(failures) == 1, [e.user_message for e in self.instance.all_logs(run_id)]
        event = failures[0].dagster_event
        assert event is not None and event.job_failure_data is not None
        error = event.job_failure_data.error
        assert error is not None, failures[0].user_message
        return error


def _level(level: str | int) -> int:
    """A log entry's level as a number (Dagster keeps a name or a number)."""
    return level if isinstance(level, int) else logging.getLevelNamesMapping().get(level, 0)


def _storyboard() -> str:
    return str(Path(sys.executable).with_name("storyboard"))


def _story() -> str:
    return str(sample_stories()["ep01"])


def _with_password(url: str) -> str:
    """``postgresql+psycopg2://user@host/db`` with :data:`DAGSTER_PASSWORD` as its password."""
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user.split(':', 1)[0]}:{DAGSTER_PASSWORD}@{host}"


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


def _dagster_database(stack: contextlib.ExitStack, pg_server_url: str) -> str:
    """A fresh Dagster database: its psycopg2 URL, with a password to be masked."""
    name, url = create_database(pg_server_url, "doors_dagster")
    stack.callback(drop_database, pg_server_url, name)
    return _with_password(url.replace("postgresql+psycopg://", "postgresql+psycopg2://"))


def _dagster_home(path: Path) -> Path:
    """A DAGSTER_HOME holding the shipped instance config, verbatim."""
    path.mkdir(parents=True)
    shutil.copyfile(ROOT / "deploy" / "dagster.yaml", path / "dagster.yaml")
    return path


@pytest.fixture
def doors(
    tmp_path: Path, pg_server_url: str, celery_broker: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Doors]:
    queue = f"storyboard-doors-{uuid.uuid4().hex[:10]}"
    with contextlib.ExitStack() as stack:
        ledger_url = create_pg_database(pg_server_url)
        stack.callback(drop_pg_database, pg_server_url, ledger_url)
        stack.callback(lambda: engine_for(ledger_url).dispose())
        dagster_url = _dagster_database(stack, pg_server_url)
        stack.callback(delete_queue, celery_broker, queue)
        monkeypatch.setenv("DAGSTER_PG_URL", dagster_url)  # the test's view of the instance
        dagster_home = _dagster_home(tmp_path / "launcher" / "dagster_home")
        (tmp_path / "home").mkdir()
        logs = tmp_path / "logs"
        logs.mkdir()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ENV_NAMES.values()
            and k not in FLEET_ENV_NAMES
            and not k.startswith(("AWS_", "DAGSTER_"))
            and k not in ("STORYBOARD_DEFS", "PIPELINE_CRASH_AT")
        }
        python_path = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
        env.update(
            {
                "PYTHONPATH": python_path.rstrip(os.pathsep),
                "DAGSTER_HOME": str(dagster_home),
                "DAGSTER_PG_URL": dagster_url,
                "PIPELINE_DB_URL": ledger_url,
                # One machine: the launcher and its workers share the home (a shared volume).
                "PIPELINE_HOME": str(tmp_path / "home"),
                "PIPELINE_EXECUTOR": "celery",
                "PIPELINE_CELERY_BROKER_URL": celery_broker,
                "PIPELINE_CELERY_QUEUE": queue,
            }
        )
        instance = dg.DagsterInstance.from_config(str(dagster_home))
        stack.callback(instance.dispose)
        doors = Doors(tmp_path, env, queue, ledger_url, dagster_url, instance, logs, [])
        try:
            yield doors
        finally:
            for process in doors.workers:  # our own process groups only
                stop_group(process)
            print(f"logs: {logs}")


def test_a_worker_of_another_instance_fails_the_run_naming_both_instances(
    doors: Doors, tmp_path: Path, pg_server_url: str
) -> None:
    """Before: the run failed with dagster-celery's ``CheckError: Invariant failed.
    Description: Could not load run ...``, naming neither instance."""
    doors.add_episode()
    with contextlib.ExitStack() as stack:
        # The worker's own instance: the same shipped config in another DAGSTER_HOME, its
        # DAGSTER_PG_URL another database (what a worker set up for another deployment has).
        other_url = _dagster_database(stack, pg_server_url)
        other_home = _dagster_home(tmp_path / "worker" / "dagster_home")
        worker_log = doors.start_worker(
            "other-instance", DAGSTER_HOME=str(other_home), DAGSTER_PG_URL=other_url
        )
        done = doors.storyboard("materialize", "--partition", PARTITION, "--step", FIRST_STEP)
        for process in doors.workers:  # before its database is dropped
            stop_group(process)
    assert done.returncode != 0, done.stdout[-3000:]
    run = doors.the_run()
    assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
    error = doors.failure(run.run_id)
    text = error.message
    assert error.cls_name in ("PipelineError", "RemotePipelineError"), error.to_string()
    assert "[fleet.instance_mismatch]" in text, text
    assert run.run_id in text
    # Both instances named: the run's (its launcher's home) and the worker's own home, and
    # where each keeps its runs, each password masked.
    launcher_home = doors.env["DAGSTER_HOME"]
    assert f"DAGSTER_HOME {launcher_home}" in text, text
    assert f"DAGSTER_HOME {other_home}" in text, text
    assert "$DAGSTER_PG_URL" in text
    other_db = other_url.rsplit("/", 1)[1]
    assert other_db in text
    assert "***" in text
    # What to do.
    assert "deploy/dagster.yaml" in text and "same Dagster instance" in text
    assert "Could not load run" not in text
    assert DAGSTER_PASSWORD not in error.to_string()
    assert DAGSTER_PASSWORD not in log_tail(worker_log, 200_000)
    assert "[fleet.instance_mismatch]" in log_tail(worker_log, 200_000)
    assert ledger_for(doors.ledger_url).provider_calls() == []
    # The launcher's command says it too (it said "[launch.run_failed] ... ended FAILURE").
    said = done.stdout + done.stderr
    assert "error: [fleet.instance_mismatch]" in said and DAGSTER_PASSWORD not in said, said


def test_a_step_on_a_queue_no_worker_consumes_is_warned_about_then_fails_the_run(
    doors: Doors,
) -> None:
    """Before: the run waited for ever, its event log silent (here: past the bound)."""
    doors.add_episode()
    doors.env[QUEUE_WAIT_ENV] = "2"
    launcher = doors.spawn(
        "materialize",
        "materialize",
        "--partition",
        PARTITION,
        "--step",
        FIRST_STEP,
        env=doors.env,
    )
    try:
        launcher.wait(timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the run still waits on queue {doors.queue}, which no worker consumes\n"
            + log_tail(doors.logs / "materialize.log")
        )
    assert launcher.returncode != 0
    run = doors.the_run()
    assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
    warnings = doors.warnings(run.run_id)
    unserved = [w for w in warnings if f"queue '{doors.queue}'" in w]
    assert unserved, warnings
    assert f"storyboard worker --queue {doors.queue}" in unserved[0]
    assert FIRST_STEP in unserved[0] and QUEUE_WAIT_ENV in unserved[0]
    error = doors.failure(run.run_id)
    assert error.cls_name == "PipelineError", error.to_string()
    assert "[fleet.queue_unserved]" in error.message, error.message
    assert f"'{doors.queue}'" in error.message
    assert f"storyboard worker --queue {doors.queue}" in error.message
    assert "guest:***@" in error.message or "guest@" in error.message
    assert ledger_for(doors.ledger_url).provider_calls() == []
    said = log_tail(doors.logs / "materialize.log", 100_000)
    assert f"error: [fleet.queue_unserved] no worker consumed Celery queue '{doors.queue}'" in said


def test_a_worker_started_after_the_warning_serves_the_waiting_step(doors: Doors) -> None:
    """Before: no warning ever came. The wait is far longer than the test: the run goes on."""
    doors.add_episode()
    launcher = doors.spawn(
        "materialize",
        "materialize",
        "--partition",
        PARTITION,
        "--step",
        FIRST_STEP,
        env=doors.env,
    )

    def warned() -> str | None:
        run = doors.the_run()
        if run is None:
            return None
        hits = [w for w in doors.warnings(run.run_id) if f"queue '{doors.queue}'" in w]
        return run.run_id if hits else None

    run_id = wait_for("the unserved-queue warning", warned, 120, doors.logs / "materialize.log")
    run = doors.instance.get_run_by_id(run_id)
    assert run is not None and run.tags.get(UNSERVED_QUEUE_TAG) == doors.queue
    status = doors.storyboard("status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    summary = json.loads(status.stdout)["summary"]
    assert summary["queue"]["unserved_queues"] == [
        {"run_id": run_id, "partition": PARTITION, "queue": doors.queue}
    ], summary
    assert f"storyboard worker --queue {doors.queue}" in doors.storyboard("status").stdout

    doors.start_worker("late")
    assert launcher.wait(timeout=300) == 0, log_tail(doors.logs / "materialize.log")
    ended = doors.instance.get_run_by_id(run_id)
    assert ended is not None and ended.status == dg.DagsterRunStatus.SUCCESS
    assert ended.tags.get(UNSERVED_QUEUE_TAG) == ""
    assert any(
        f"a worker now consumes Celery queue '{doors.queue}'" in w
        for w in doors.warnings(run_id, logging.INFO)
    )


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon", "86401"])
def test_a_bad_queue_wait_is_refused_by_its_variable(value: str) -> None:
    with pytest.raises(PipelineError) as raised:
        FleetSettings.from_env({QUEUE_WAIT_ENV: value})
    assert raised.value.code == "settings.invalid"
    assert QUEUE_WAIT_ENV in raised.value.message


def test_the_queue_wait_has_a_default_of_minutes() -> None:
    assert FleetSettings.from_env({}).queue_wait_seconds == DEFAULT_QUEUE_WAIT_SECONDS == 300
    assert FleetSettings.from_env({QUEUE_WAIT_ENV: "45"}).queue_wait_seconds == 45


def test_a_celery_materialize_prints_no_duplicate_task_warning(doors: Doors) -> None:
    """Before: every run's coordinator printed Celery's nine-line ``DuplicateTaskNameWarning``
    (dagster-celery registers its step task again for each step it sends)."""
    doors.add_episode()
    doors.start_worker("quiet")
    done = doors.storyboard(
        "materialize", "--partition", PARTITION, "--step", FIRST_STEP, "--step", "entity_canon"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "DuplicateTaskNameWarning" not in done.stderr, done.stderr
    assert "already registered" not in done.stderr, done.stderr


def _parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def test_a_step_s_worker_is_named_as_it_was_started_with_its_pool_child(doors: Doors) -> None:
    """Before: status and the claim's history line named the Celery pool child (``host:pid``
    of the child) while Dagster's event log named the ``storyboard worker`` process
    (``storyboard-<pid>@host``): two names for one worker."""
    doors.add_episode()
    doors.start_worker("named")
    started = doors.workers[-1]
    done = doors.storyboard("materialize", "--partition", PARTITION, "--step", FIRST_STEP)
    assert done.returncode == 0, done.stderr[-3000:]
    host = socket.gethostname()
    name = f"storyboard-{started.pid}@{host}"
    # Dagster's event log names the process the user started.
    run = doors.the_run()
    assert run is not None
    nodes = {
        str(e.dagster_event.engine_event_data.metadata["Celery worker"].value)
        for e in doors.instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
        if e.dagster_event is not None and "in celery worker" in (e.dagster_event.message or "")
    }
    assert nodes == {name}, nodes
    # The claim's history line: that name, then the pool child that ran the step.
    claims = [
        t
        for t in ledger_for(doors.ledger_url).transitions()
        if t.key.step_id == FIRST_STEP and t.to_status is StepStatus.RUNNING
    ]
    assert len(claims) == 1, claims
    said = claims[0].worker
    assert said is not None and said.startswith(f"{name}, child {host}:"), said
    child = int(said.rsplit(":", 1)[1])
    assert child != started.pid and _parent_of(child) == started.pid, said
    # status --json and status's text: the same words.
    status = doors.storyboard("status", "--json")
    assert status.returncode == 0, status.stderr[-3000:]
    steps = {s["step"]: s for s in json.loads(status.stdout)["steps"]}
    assert steps[FIRST_STEP]["worker"] == said, steps[FIRST_STEP]
    text = doors.storyboard("status")
    assert text.returncode == 0, text.stderr[-3000:]
    assert said in text.stdout, text.stdout
