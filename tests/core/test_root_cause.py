"""The real cause reaches the operator.

Faults are produced for real: a full tmpfs, a read-only bind mount, a SQLite ledger opened
read-only, steps that raise ``OverflowError`` / ``TypeError`` from ordinary code, an invalid
project file. ``storyboard materialize`` runs in-process; the assertions read its one error
line and the step failure Dagster recorded (what the UI shows).
"""

import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml
from cli_helpers import CliEnv, make_env
from must_run import skip_or_fail
from storyboard_fakes import EchoTextModel, Source

from pipeline_defs.definitions import build_resources
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.spec import Step, StepResult
from pipeline_defs.wiring.assets import build_step_assets
from resources.checkpoints.envelope import Checkpoint


class Overflowing(Step):
    """Schedules a follow-up a million days per story line away: past year 9999."""

    step_id = "overflowing"
    deps = ("source",)

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        lines = len(inputs["source"].data["lines"])
        follow_up = datetime.now(UTC) + timedelta(days=lines * 10**6)
        return StepResult(data={"follow_up": follow_up.isoformat()})


class Mistyped(Step):
    """Adds a count to a text: TypeError."""

    step_id = "mistyped"
    deps = ("source",)

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        title: str = inputs["source"].data["lines"][0]
        label = title + len(title)  # type: ignore[operator]
        return StepResult(data={"label": label})


STEPS: tuple[Step, ...] = (Source(), Overflowing(), Mistyped())


def build_defs() -> dg.Definitions:
    resources = build_resources(None)
    resources["text_model"] = EchoTextModel()
    return dg.Definitions(assets=build_step_assets(STEPS), resources=resources)


defs = build_defs()


@pytest.fixture
def root_cause_cli(tmp_path: Path) -> CliEnv:
    env = make_env(tmp_path)
    env.defs = "test_root_cause:defs"
    return env


def add(root_cause_cli: CliEnv, project: str = "p1", episode: str = "e1") -> None:
    root_cause_cli.ok(
        "add-episode",
        "--project",
        project,
        "--episode",
        episode,
        "--story",
        str(root_cause_cli.story("fox")),
    )


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def failure_descriptions(root_cause_cli: CliEnv, run_id: str) -> dict[str, str]:
    """Step key -> the failure description Dagster recorded (the UI's first line)."""
    instance = dg.DagsterInstance.from_config(str(root_cause_cli.dagster_home))
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    out: dict[str, str] = {}
    for record in records.records:
        event = record.event_log_entry.dagster_event
        assert event is not None and event.step_key is not None
        data = event.step_failure_data
        assert data.user_failure_data is not None, data.error
        out[event.step_key] = str(data.user_failure_data.description)
    return out


def materialize(
    root_cause_cli: CliEnv, *steps: str, env: Mapping[str, str | None] | None = None
) -> str:
    """Run it, expect a failure; return the error line (and check the JSON agrees)."""
    args = ["materialize", "--partition", "p1/e1", *(a for s in steps for a in ("--step", s))]
    result = root_cause_cli.invoke(*args, env=env)
    assert result.exit_code == 1, result.output
    line = error_line(result.stderr)
    assert "DagsterExecutionStepExecutionError" not in line
    assert "Error occurred while executing" not in line
    return line


# --------------------------------------------------------------------------- mounts (root)
def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, text=True)


@contextlib.contextmanager
def mounted(*mount_args: str, target: Path) -> Iterator[Path]:
    """``mount ARGS TARGET``, always unmounted; skipped where mounting is not allowed (failed
    in CI, where these tests must run)."""
    target.mkdir(parents=True, exist_ok=True)
    try:
        _run("mount", *mount_args, str(target))
    except (OSError, subprocess.CalledProcessError) as exc:
        skip_or_fail(f"cannot mount here ({exc}); needs root with CAP_SYS_ADMIN")
    try:
        yield target
    finally:
        _run("umount", "-l", str(target))


@contextlib.contextmanager
def read_only_view(source: Path, target: Path) -> Iterator[Path]:
    """A read-only bind mount of ``source`` (chmod does not stop root; a mount does)."""
    with mounted("--bind", str(source), target=target):
        _run("mount", "-o", "remount,bind,ro", str(target))
        yield target


def fill(folder: Path) -> None:
    """Write until the file system says ENOSPC."""
    fd = os.open(folder / "filler.bin", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 1024)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- storage faults
def test_a_full_disk_under_the_checkpoints_is_named(root_cause_cli: CliEnv, tmp_path: Path) -> None:
    with mounted("-t", "tmpfs", "-o", "size=64k", "tmpfs", target=tmp_path / "small") as small:
        root_cause_cli.home = small / "home"
        root_cause_cli.home.mkdir()
        root_cause_cli.db_url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"  # the ledger has room
        add(root_cause_cli)
        fill(small)
        payload = root_cause_cli.json("materialize", "--partition", "p1/e1", "--step", "source")
        line = materialize(root_cause_cli, "source")
        assert "[storage.full] " in line and "no space left on device writing" in line, line
        assert str(root_cause_cli.home / "checkpoints" / "p1" / "e1" / "source") in line, line
        assert payload["error"]["code"] == "storage.full"
        described = failure_descriptions(root_cause_cli, payload["run_id"])["source"]
        assert described.startswith("[storage.full] no space left on device writing"), described


def test_a_full_sqlite_ledger_is_named(root_cause_cli: CliEnv, tmp_path: Path) -> None:
    with mounted("-t", "tmpfs", "-o", "size=256k", "tmpfs", target=tmp_path / "small") as small:
        root_cause_cli.db_url = f"sqlite:///{small / 'ledger.sqlite3'}"
        root_cause_cli.ok("migrate")
        add(root_cause_cli)
        fill(small)
        line = materialize(root_cause_cli, "source")
        assert "[storage.full] " in line and "the ledger database is full" in line, line
        assert "database or disk is full" in line, line


def test_a_read_only_home_is_named_in_runs_and_in_the_cli(
    root_cause_cli: CliEnv, tmp_path: Path
) -> None:
    root_cause_cli.db_url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    add(root_cause_cli)
    with read_only_view(root_cause_cli.home, tmp_path / "ro_home") as ro_home:
        env = {"PIPELINE_HOME": str(ro_home)}
        line = materialize(root_cause_cli, "source", env=env)
        assert "[storage.read_only] " in line and "read-only file system writing" in line, line
        assert str(ro_home / "checkpoints") in line, line
        run_id = json.loads(
            root_cause_cli.invoke("materialize", "--partition", "p1/e1", "--json", env=env).stdout
        )["run_id"]
        described = failure_descriptions(root_cause_cli, run_id)["source"]
        assert described.startswith("[storage.read_only] read-only file system"), described

        # outside any run: the CLI itself writes the story (was "[internal] OSError: [Errno 30]")
        story = str(root_cause_cli.story("ship"))
        added = root_cause_cli.invoke(
            "add-episode", "--project", "p1", "--episode", "e2", "--story", story, env=env
        )
        assert added.exit_code == 1
        line = error_line(added.stderr)
        assert line.startswith("error: [storage.read_only] read-only file system writing"), line
        assert "e2" in line and "[internal]" not in line, line


def test_a_read_only_sqlite_ledger_is_named(root_cause_cli: CliEnv, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    root_cause_cli.db_url = f"sqlite:///{ledger}"
    root_cause_cli.ok("migrate")
    add(root_cause_cli)
    read_only = f"sqlite:///file:{ledger}?mode=ro&uri=true"
    line = materialize(root_cause_cli, "source", env={"PIPELINE_DB_URL": read_only})
    assert "[storage.read_only] " in line and "the ledger database is read-only" in line, line
    assert "readonly database" in line, line


# --------------------------------------------------------------------------- unexpected errors
@pytest.mark.parametrize(
    ("step", "kind", "text"),
    [
        ("overflowing", "OverflowError", "date value out of range"),
        ("mistyped", "TypeError", 'can only concatenate str (not "int") to str'),
    ],
)
def test_an_unexpected_error_keeps_its_type_and_message(
    root_cause_cli: CliEnv, step: str, kind: str, text: str
) -> None:
    add(root_cause_cli)
    payload = root_cause_cli.json(
        "materialize", "--partition", "p1/e1", "--step", "source", "--step", step
    )
    line = materialize(root_cause_cli, step)
    assert f"error: [internal] {step} failed: {kind}: {text} (run " in line, line
    assert payload["error"]["code"] == "internal"
    assert payload["error"]["message"].startswith(f"{step} failed: {kind}: {text} (run ")
    described = failure_descriptions(root_cause_cli, payload["run_id"])[step]
    assert described == f"[internal] {kind}: {text}", described
    row = root_cause_cli.ledger.get(StepKey("p1", "e1", step))
    assert row is not None and row.status == "failed" and text in (row.error_message or "")


# --------------------------------------------------------------------------- advice that works
def test_an_invalid_project_file_names_the_file_and_field_not_a_force(
    root_cause_cli: CliEnv,
) -> None:
    add(root_cause_cli)
    root_cause_cli.ok("materialize", "--partition", "p1/e1", "--step", "source")
    config = root_cause_cli.home / "projects" / "p1" / "project.yaml"
    data = yaml.safe_load(config.read_text())
    data["scenes"]["camera_stlye"] = "wide"  # a typo: an unknown key
    config.write_text(yaml.safe_dump(data))

    line = materialize(root_cause_cli, "source")
    assert "[config.invalid]" in line and str(config) in line and "scenes.camera_stlye" in line

    decided = root_cause_cli.json("decide", "--partition", "p1/e1")
    blocked = [d for d in decided["decisions"] if d["verdict"] == "blocked"]
    assert blocked, decided
    for item in blocked:
        assert str(config) in item["what_to_do"] and "scenes.camera_stlye" in item["what_to_do"]
        assert "storyboard force" not in item["what_to_do"], item["what_to_do"]
    for command in ("decide", "status"):
        text = root_cause_cli.ok(command, "--partition", "p1/e1").stdout
        assert "storyboard force" not in text, text
        fix = f"fix the project file: {config}: scenes.camera_stlye: unknown key."
        assert fix in " ".join(text.split()), text


# --------------------------------------------------------------------------- outside the body
def _failure_of(asset: dg.AssetsDefinition) -> tuple[str | None, str]:
    """Run one untyped asset for real; what the CLI reads from its failure event."""
    from pipeline_defs.operations.run_report import failure_info

    result = dg.materialize([asset], raise_on_error=False)
    (event,) = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    return failure_info(event)


def test_a_failure_outside_the_typed_body_is_walked_to_its_cause(tmp_path: Path) -> None:
    """Errors Dagster wraps itself (an IO manager, a resource, any untyped asset) are read
    from the serialized cause chain, not from the wrapper's "Error occurred while ..."."""

    @dg.asset
    def overflows() -> str:
        return (datetime.now(UTC) + timedelta(days=10**7)).isoformat()

    assert _failure_of(overflows) == ("internal", "OverflowError: date value out of range")

    with mounted("-t", "tmpfs", "-o", "size=64k", "tmpfs", target=tmp_path / "small") as small:
        fill(small)

        @dg.asset
        def writes() -> None:
            (small / "more.bin").write_bytes(b"\0" * 65536)

        code, message = _failure_of(writes)
        assert code == "storage.full", message
        assert message.startswith("no space left on device: OSError: [Errno 28]"), message
