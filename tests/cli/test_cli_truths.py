"""One truth across ``status``, ``decide``, the sensor and the UI.

Real ledgers (SQLite, and PostgreSQL through ``db_url`` where it is cheap), a real Dagster
instance, the CLI invoked in-process on the test-only steps of ``storyboard_fakes``.
"""

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
import yaml
from cli_helpers import CliEnv, ledger_dump

from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.store import CheckpointStore

FAKE_STEP_IDS = ("source", "outline", "sketch", "probe")
NOT_REGISTERED = "is not registered in the Dagster instance"


def add(cli: CliEnv, project: str, episode: str, story: str = "fox") -> None:
    cli.ok(
        "add-episode", "--project", project, "--episode", episode, "--story", str(cli.story(story))
    )


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def change_camera_style(cli: CliEnv, project: str, value: str = "extreme close-up") -> None:
    """A scoped config change: ``outline`` (scoped to it) then blocks as contract drift."""
    path = cli.home / "projects" / project / "project.yaml"
    data = yaml.safe_load(path.read_text())
    data["scenes"]["camera_style"] = value
    path.write_text(yaml.safe_dump(data))


def instance_of(cli: CliEnv) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(cli.dagster_home))


# --------------------------------------------------------------------------- a. status = decide
def test_status_shows_the_blocks_decide_reports(cli_db: CliEnv) -> None:
    """A change after the checkpoint blocks in ``decide`` (and the sensor); ``status`` said 0."""
    cli = cli_db
    add(cli, "p1", "e1")
    cli.ok("materialize", "--partition", "p1/e1")
    change_camera_style(cli, "p1")  # nothing ran since: no "block" audit row exists

    decided = cli.json("decide")
    blocked = [d for d in decided["decisions"] if d["verdict"] == "blocked"]
    assert [(d["partition"], d["step"]) for d in blocked] == [("p1/e1", "outline")]

    before = ledger_dump(cli.db_url)
    status = cli.json("status")
    assert ledger_dump(cli.db_url) == before, "status judges read-only"
    assert status["totals"]["blocked"] == decided["counts"]["blocked"] == 1
    rows = {r["step"]: r for r in status["steps"]}
    assert rows["outline"]["verdict"] == "blocked"
    assert rows["outline"]["block_origin"] == "contract_drift"
    assert "scenes.camera_style" in rows["outline"]["block_reason"]
    assert rows["outline"]["last_decision"] == "first_run", "history is kept apart"
    verdicts = {(d["partition"], d["step"]): d["verdict"] for d in decided["decisions"]}
    assert {(r["partition"], r["step"]): r["verdict"] for r in status["steps"]} == verdicts

    text = cli.ok("status").stdout
    assert "blocked 1" in text
    assert "scenes.camera_style" in text
    assert "storyboard force --partition p1/e1 --step outline" in text


def test_a_step_waiting_on_a_blocked_upstream_says_so_naming_it(cli: CliEnv) -> None:
    """Not "artifacts are missing": what holds the step is its blocked upstream."""
    add(cli, "p1", "e1")
    cli.ok("materialize", "--partition", "p1/e1")
    CheckpointStore(cli.home).path_for(StepKey("p1", "e1", "sketch")).unlink()
    change_camera_style(cli, "p1")  # outline blocks (contract drift)

    decided = cli.json("decide")
    sketch = next(d for d in decided["decisions"] if d["step"] == "sketch")
    assert sketch["verdict"] == "waiting", sketch
    assert sketch["reason"].startswith("waits on blocked upstream outline"), sketch
    text = cli.ok("decide").stdout  # its row, the reason on it or wrapped below it
    assert re.search(r"sketch +waiting.*?waits on blocked upstream outline", text, re.S), text


# --------------------------------------------------------------------------- b. unknown partitions
def test_every_partition_command_refuses_an_unregistered_partition(cli: CliEnv) -> None:
    add(cli, "demo", "ep01")
    cli.ok("materialize", "--partition", "demo/ep01")
    commands = {
        "materialize": ("materialize", "--partition", "demo/ep99"),
        "force": ("force", "--partition", "demo/ep99", "--step", "outline"),
        "status": ("status", "--partition", "demo/ep99"),
        "decide": ("decide", "--partition", "demo/ep99"),
        "reset-running": (
            "reset-running", "--partition", "demo/ep99", "--step", "outline", "--null-started-at",
        ),
    }  # fmt: skip
    lines = {}
    for name, args in commands.items():
        result = cli.invoke(*args)
        assert result.exit_code == 1, (name, result.output)
        lines[name] = error_line(result.stderr)
        assert NOT_REGISTERED in lines[name] and "'demo/ep99'" in lines[name], lines[name]
        as_json = cli.invoke(*args, "--json")
        assert as_json.exit_code == 1
        payload = json.loads(as_json.stdout)
        assert payload["ok"] is False and payload["error"]["code"] == "input.invalid", name
    assert len(set(lines.values())) == 1, "one helper, one message"
    # a registered one still works everywhere, and an unregistered one is not half-shown
    assert cli.json("status", "--partition", "demo/ep01")["totals"]["partitions"] == 1
    assert cli.json("decide", "--partition", "demo/ep01")["counts"] == {"skip": 4}


def test_status_of_a_partition_known_only_to_the_ledger_still_works(cli: CliEnv) -> None:
    """The ledger outlives a wiped Dagster instance: its rows stay inspectable (and resettable)."""
    cli.ok("migrate")
    key = StepKey("gone", "e1", "outline")
    assert cli.ledger.claim(key, "dead:0")
    rows = cli.json("status", "--partition", "gone/e1")["steps"]
    assert {r["step"]: r["status"] for r in rows}["outline"] == "running"


# --------------------------------------------------------------------------- c. malformed keys
@pytest.mark.parametrize("bad", ["oops no slash", "demo/ep01/x"])
def test_a_malformed_registered_key_is_reported_once_and_skipped(cli: CliEnv, bad: str) -> None:
    add(cli, "p1", "e1")
    cli.ok("materialize", "--partition", "p1/e1")
    instance_of(cli).add_dynamic_partitions("episodes", [bad])

    for command in ("decide", "status", "audit-running"):
        result = cli.invoke(command)
        assert result.exit_code == 0, (command, result.output, result.exception)
        if command == "audit-running":
            continue  # reads ledger rows only: nothing to skip, nothing to say
        warnings = [line for line in result.stderr.splitlines() if repr(bad) in line]
        assert len(warnings) == 1, (command, result.stderr)
        assert warnings[0].startswith("warning: [input.invalid_id]") and "skipped" in warnings[0]
        assert bad not in result.stdout

    decided = json.loads(cli.invoke("decide", "--json").stdout)
    assert decided["ok"] and decided["counts"] == {"skip": 4}
    assert decided["invalid_partitions"] == [bad]
    status = json.loads(cli.invoke("status", "--json").stdout)
    assert status["invalid_partitions"] == [bad]
    assert {r["partition"] for r in status["steps"]} == {"p1/e1"}


# --------------------------------------------------------------------------- d. reset-running ids
def test_reset_running_validates_the_step_and_partition_first(cli: CliEnv) -> None:
    add(cli, "p1", "e1")
    bogus = cli.invoke(
        "reset-running", "--partition", "p1/e1", "--step", "bogus", "--null-started-at"
    )
    assert bogus.exit_code == 1
    line = error_line(bogus.stderr)
    assert "unknown step 'bogus'" in line and "source, outline, sketch, probe" in line, line
    assert "no ledger row" not in line

    cli.ok("migrate")
    nothing = cli.invoke(
        "reset-running", "--partition", "p1/e1", "--step", "outline", "--null-started-at"
    )
    line = error_line(nothing.stderr)
    assert "[step.reset_refused]" in line and "the row has no ledger row" not in line, line
    assert "there is no ledger row" in line


# --------------------------------------------------------------------------- e. PIPELINE_HOME
def test_a_missing_ledger_names_the_home_used_and_how_to_set_it(
    cli: CliEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = cli.invoke("status", env={"PIPELINE_HOME": None, "PIPELINE_DB_URL": None})
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert "[ledger.not_migrated]" in line
    assert "PIPELINE_HOME" in line and "not set" in line, line
    assert "./.pipeline" in line and str(elsewhere) in line, line
    assert "export PIPELINE_HOME=" in line, line
    assert "storyboard migrate" not in line, "never suggest an empty ledger somewhere unexpected"
    assert not (elsewhere / ".pipeline").exists()

    explicit = cli.invoke("status", env={"PIPELINE_DB_URL": None})  # home set, no ledger yet
    line = error_line(explicit.stderr)
    assert f"PIPELINE_HOME={cli.home}" in line and "storyboard migrate" in line, line


# --------------------------------------------------------------------------- f. decide width
FORCE_OUTLINE = "storyboard force --partition p1/e1 --step outline"


@pytest.mark.parametrize("columns", [60, 250])
def test_decide_fits_the_terminal_and_prints_whole_commands(cli: CliEnv, columns: int) -> None:
    add(cli, "p1", "e1")
    cli.ok("materialize", "--partition", "p1/e1")
    change_camera_style(cli, "p1", "a very long camera style " * 6)
    reason = next(d for d in cli.json("decide")["decisions"] if d["step"] == "outline")["reason"]
    assert len(reason) > 70

    out = cli.invoke("decide", env={"COLUMNS": str(columns)}).stdout
    assert "…" not in out, "nothing is cut"
    assert FORCE_OUTLINE in [line.strip() for line in out.splitlines()], "own line, whole"
    words = " ".join(out.split())
    assert " ".join(reason.split()) in words, "the whole reason is there, wrapped or not"
    for line in out.splitlines():
        if line.strip() != FORCE_OUTLINE and not line.startswith("----"):
            assert len(line) <= max(columns, 80), (columns, line)
    if columns == 250:
        assert any(" ".join(reason.split()) in line for line in out.splitlines()), "one line"


# --------------------------------------------------------------------------- g. calls labelled
def test_provider_call_columns_say_which_calls_they_count(cli: CliEnv) -> None:
    add(cli, "p1", "e1")
    cli.ok("materialize", "--partition", "p1/e1")
    forced = cli.ok("force", "--partition", "p1/e1", "--step", "outline").stdout
    assert "calls this run" in forced
    assert re.search(r"outline\s+force_explicit\s+completed\s+3\b", forced), forced

    status = cli.ok("status", "--partition", "p1/e1").stdout
    header = status.splitlines()[0]
    assert "calls total" in header and re.search(r"\bcalls\s+last dur", header) is None
    outline = next(line for line in status.splitlines() if " outline " in line)
    assert re.search(r"\b6\b", outline), "3 + 3 calls over two runs, labelled as the total"
    assert "provider calls total 10" in status


def test_decide_says_a_launch_is_held_once_its_attempts_failed_before_changing_anything(
    cli: CliEnv,
) -> None:
    """docs/DESIGN.md#stranded-runs: when every attempt of a launch failed before it changed
    anything (the broker down), the sensor holds it until something changes and reports a
    failed check. ``decide`` reads the same runs of the instance: its launch rows say they
    are held, why, and the command that launches them now."""
    import uuid

    from pipeline_defs.resume.settings import ResumeSettings

    cli.ok("migrate")
    add(cli, "p1", "e1")
    decided = cli.json("decide", "--partition", "p1/e1")
    assert decided["ok"], decided
    launches = [d for d in decided["decisions"] if d["launch"]]
    assert launches and not any(d["what_to_do"] for d in launches), launches
    (run_key,) = {d["run_key"] for d in launches}
    instance = instance_of(cli)
    attempts = ResumeSettings().max_recovery_attempts + 1
    for key in [run_key, *(f"{run_key}:again{n}" for n in range(1, attempts))]:
        run = dg.DagsterRun(
            job_name="resume_steps",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.STARTED,
            tags={"dagster/partition": "p1/e1", "dagster/run_key": key},
        )
        instance.add_run(run)
        instance.report_run_failed(run, "kombu.exceptions.OperationalError: broker down")
    held = [d for d in cli.json("decide", "--partition", "p1/e1")["decisions"] if d["launch"]]
    assert [d["step"] for d in held] == [d["step"] for d in launches]
    for d in held:
        assert f"failed {attempts} times before it changed anything" in d["what_to_do"], d
        assert "storyboard materialize --partition p1/e1" in d["what_to_do"], d
    assert "held: its launch failed" in cli.ok("decide", "--partition", "p1/e1").stdout


@pytest.mark.parametrize("death", ["failed", "deleted"])
def test_a_dead_owner_is_judged_as_the_sensor_judges_it(cli: CliEnv, death: str) -> None:
    """A running row whose Dagster run has ended (run monitoring marked it failed) holds a
    fresh heartbeat but no worker: the sensor relaunches it now, so ``decide`` and ``status``
    must say that, not that the run is working on it. A run deleted from the instance is
    unknown here, as another deployment's live run would be: its heartbeat decides."""
    import sqlalchemy as sa

    from pipeline_defs.resume.clock import format_timestamp
    from pipeline_defs.resume.partition import Episode
    from resources.ledger.tables import step_run

    add(cli, "p1", "e1")
    cli.ok("materialize", "--partition", "p1/e1")

    @dg.op
    def boom() -> None:
        raise RuntimeError("the worker died")

    @dg.job
    def dead() -> None:
        boom()

    instance = dg.DagsterInstance.from_config(str(cli.dagster_home))
    ended = dead.execute_in_process(instance=instance, raise_on_error=False)
    assert not ended.success
    if death == "deleted":
        instance.delete_run(ended.run_id)
    now = format_timestamp(datetime.now(UTC))
    step = Episode.parse("p1/e1").step("source")
    with cli.ledger.engine.begin() as conn:
        conn.execute(
            sa.update(step_run)
            .where(
                (step_run.c.project_id == step.project_id) & (step_run.c.step_id == step.step_id)
            )
            .values(
                status="running",
                run_id=f"{ended.run_id}:0",
                started_at=now,
                heartbeat_at=now,  # a fresh heartbeat: only the ended run says it is dead
                updated_at=now,
            )
        )

    decided = {d["step"]: d for d in cli.json("decide", "--all")["decisions"]}
    source = decided["source"]
    if death == "deleted":
        # Unknown here, as another deployment's run would be: its fresh heartbeat says alive.
        assert source["verdict"] != "launch", source
        state = cli.json("status", "--partition", "p1/e1")
        (row,) = [s for s in state["steps"] if s["step"] == "source"]
        assert row["running_healthy"], row
        return
    assert (source["verdict"], source["action"]) == ("launch", "stale_running_recovery")
    assert ended.run_id in source["detail"] and "ended (FAILURE)" in source["detail"]
    status = cli.json("status", "--partition", "p1/e1")
    (state,) = [s for s in status["steps"] if s["step"] == "source"]
    assert state["verdict"] == "launch" and not state["running_healthy"]
    assert "working on it" not in cli.ok("status", "--partition", "p1/e1").output
