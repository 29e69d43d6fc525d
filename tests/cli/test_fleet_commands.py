"""The fleet's doors: settings refused by their variable, a worker that cannot reach its
broker or backend refuses to start, a fleet launch on an instance the workers cannot share
is refused before any step runs (docs/DESIGN.md#fleet)."""

import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import CliEnv, make_env

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.fleet_settings import (
    CELERY,
    DEFAULT_BACKEND_URL,
    DEFAULT_BROKER_URL,
    DEFAULT_QUEUE,
    MULTIPROCESS,
    FleetSettings,
    masked,
)

STORYBOARD = str(Path(sys.executable).with_name("storyboard"))
# Nothing listens on port 1: connections are refused at once.
DEAD_BROKER = "pyamqp://fleet:s3cret@127.0.0.1:1//"
DEAD_BACKEND = "redis://:s3cret@127.0.0.1:1/0"


def test_defaults_and_overrides() -> None:
    assert FleetSettings.from_env({}) == FleetSettings(
        MULTIPROCESS, DEFAULT_BROKER_URL, DEFAULT_BACKEND_URL, DEFAULT_QUEUE
    )
    chosen = FleetSettings.from_env(
        {
            "PIPELINE_EXECUTOR": "Celery",
            "PIPELINE_CELERY_BROKER_URL": "redis://127.0.0.1:6379/1",
            "PIPELINE_CELERY_QUEUE": "team-a",
        }
    )
    assert (chosen.executor, chosen.broker_url, chosen.queue) == (
        CELERY,
        "redis://127.0.0.1:6379/1",
        "team-a",
    )
    assert FleetSettings.from_env({"PIPELINE_CELERY_QUEUE": "a"}, queue="b").queue == "b"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"PIPELINE_EXECUTOR": "dask"}, "PIPELINE_EXECUTOR"),
        ({"PIPELINE_CELERY_BROKER_URL": "http://x:s3cret@host/"}, "PIPELINE_CELERY_BROKER_URL"),
        ({"PIPELINE_CELERY_BACKEND_URL": "db+sqlite:///r.db"}, "PIPELINE_CELERY_BACKEND_URL"),
        ({"PIPELINE_CELERY_QUEUE": "a b"}, "PIPELINE_CELERY_QUEUE"),
        ({"PIPELINE_CELERY_QUEUE": "x" * 101}, "PIPELINE_CELERY_QUEUE"),
    ],
)
def test_a_bad_setting_is_refused_by_its_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(PipelineError) as raised:
        FleetSettings.from_env(env)
    assert raised.value.code == ErrorCode.SETTINGS_INVALID
    assert variable in raised.value.message
    assert "s3cret" not in raised.value.message


def test_passwords_are_masked() -> None:
    assert masked("pyamqp://u:pw@h:5672//") == "pyamqp://u:***@h:5672//"
    assert masked("redis://:pw@h/0") == "redis://:***@h/0"
    assert masked("redis://h:6379/0") == "redis://h:6379/0"


@pytest.mark.parametrize("password", ["s3#cret", "s3/cret", "s3?cret", "s#3/c?ret"])
def test_a_password_with_unencoded_url_characters_is_masked_whole(password: str) -> None:
    """Before, ``urlsplit`` ended the user part at the first '#', '/' or '?', and the rest of
    the password was printed as a fragment, a path or a query."""
    url = f"pyamqp://fleet:{password}@127.0.0.1:5672//"
    assert masked(url) == "pyamqp://fleet:***@127.0.0.1:5672//"
    with pytest.raises(PipelineError) as raised:
        FleetSettings.from_env({"PIPELINE_CELERY_BROKER_URL": url})
    assert raised.value.code == ErrorCode.SETTINGS_INVALID
    assert "percent-encode" in raised.value.message
    assert password not in raised.value.message and "cret" not in raised.value.message


@pytest.mark.parametrize(
    ("variable", "url", "why"),
    [
        ("PIPELINE_CELERY_BROKER_URL", "pyamqp://fleet:s3cret@127.0.0.1:99999//", "parse"),
        ("PIPELINE_CELERY_BROKER_URL", "pyamqp://fleet:s3cret@127.0.0.1:ab//", "parse"),
        ("PIPELINE_CELERY_BROKER_URL", "pyamqp://fleet:s3cret@127.0.0.1:0//", "port 0"),
        ("PIPELINE_CELERY_BACKEND_URL", "redis://:s3cret@127.0.0.1:-1/0", "parse"),
        ("PIPELINE_CELERY_BACKEND_URL", "redis://:s3cret@:6379/0", "no host"),
    ],
)
def test_a_bad_port_or_host_is_a_typed_refusal(variable: str, url: str, why: str) -> None:
    """Before: a 52-line traceback from kombu at the worker's first connection."""
    with pytest.raises(PipelineError) as raised:
        FleetSettings.from_env({variable: url})
    assert raised.value.code == ErrorCode.SETTINGS_INVALID
    assert variable in raised.value.message and why in raised.value.message
    assert "s3cret" not in raised.value.message


@pytest.mark.parametrize("queue", ["", "  "])
def test_an_empty_queue_option_is_refused_not_taken_for_the_default(queue: str) -> None:
    """``storyboard worker --queue ''`` served the default queue ``dagster``."""
    with pytest.raises(PipelineError) as raised:
        FleetSettings.from_env({}, queue=queue)
    assert raised.value.code == ErrorCode.SETTINGS_INVALID and "--queue" in raised.value.message


def _worker(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    cli = make_env(tmp_path)
    return subprocess.run(
        [STORYBOARD, "worker"],
        env={**cli.subprocess_env(), "STORYBOARD_DEFS": "", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_worker_without_its_broker_refuses_to_start(tmp_path: Path) -> None:
    done = _worker(tmp_path, PIPELINE_CELERY_BROKER_URL=DEAD_BROKER)
    assert done.returncode == 1, done.stderr
    error = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1, done.stderr
    assert "[fleet.broker_unreachable]" in error[0]
    assert "PIPELINE_CELERY_BROKER_URL" in error[0] and "127.0.0.1:1" in error[0]
    assert "s3cret" not in done.stderr + done.stdout


def test_a_worker_without_its_result_backend_refuses_to_start(
    tmp_path: Path, celery_broker: str
) -> None:
    done = _worker(
        tmp_path, PIPELINE_CELERY_BROKER_URL=celery_broker, PIPELINE_CELERY_BACKEND_URL=DEAD_BACKEND
    )
    assert done.returncode == 1, done.stderr
    assert "[fleet.broker_unreachable]" in done.stderr
    assert "PIPELINE_CELERY_BACKEND_URL" in done.stderr
    assert "s3cret" not in done.stderr + done.stdout


def test_a_fleet_launch_on_an_unshared_instance_is_refused_before_any_step(
    tmp_path: Path,
) -> None:
    cli = make_env(tmp_path)
    env = {**cli.subprocess_env(), "STORYBOARD_DEFS": "", "PIPELINE_EXECUTOR": "celery"}
    story = cli.story("fox")
    add = [STORYBOARD, "add-episode", "--project", "p", "--episode", "e", "--story", str(story)]
    assert subprocess.run(add, env=env, capture_output=True, check=False).returncode == 0
    done = subprocess.run(
        [STORYBOARD, "materialize", "--partition", "p/e"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "[fleet.instance_not_shared]" in done.stderr, done.stderr
    assert "PostgreSQL" in done.stderr
    assert cli.ledger.provider_calls() == []


def test_every_job_of_the_location_runs_its_steps_on_the_fleet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launchpad and backfills (the implicit asset job) and the resume sensor's runs
    (its own job) take the Definitions' executor: Celery under PIPELINE_EXECUTOR=celery."""
    from pipeline_defs.definitions import build_defs
    from sensors.resume_sensor import STEPS_JOB

    monkeypatch.setenv("PIPELINE_EXECUTOR", "celery")
    fleet = build_defs()
    for job in (fleet.resolve_implicit_global_asset_job_def(), fleet.resolve_job_def(STEPS_JOB)):
        assert job.executor_def.name == "celery", job.name
    monkeypatch.delenv("PIPELINE_EXECUTOR")
    local = build_defs()
    assert local.resolve_job_def(STEPS_JOB).executor_def.name != "celery"


@pytest.mark.parametrize("hours", ["nan", "inf", "1e99"])
def test_gc_refuses_a_grace_period_that_is_no_span_of_hours(cli: CliEnv, hours: str) -> None:
    """Before: ``[internal]`` (timedelta's OverflowError or ValueError)."""
    result = cli.invoke("gc", "--grace-hours", hours, "--dry-run")
    assert result.exit_code == 2, result.output
    assert "--grace-hours" in result.output and "no grace period" in result.output
    assert "internal" not in result.output
