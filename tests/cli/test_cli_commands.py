"""The operator CLI on test-only steps (``storyboard_fakes``): every command, errors, writes."""

import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from cli_helpers import CliEnv, ledger_dump, tree_snapshot

from pipeline_defs.operations.workspace import ledger_head
from pipeline_defs.project import ProjectConfig
from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.runner.run_info import run_token_of
from resources.ledger.tables import step_run


def add(cli: CliEnv, project: str, episode: str, story: str = "fox") -> None:
    cli.ok(
        "add-episode", "--project", project, "--episode", episode, "--story", str(cli.story(story))
    )


def instance_of(cli: CliEnv) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(cli.dagster_home))


def one_line_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


# --------------------------------------------------------------------------- migrate
def test_migrate_brings_the_ledger_to_head_idempotently(cli_db: CliEnv) -> None:
    first = cli_db.json("migrate")
    again = cli_db.json("migrate")
    assert first["ok"] and first["revision"] == again["revision"] == ledger_head()
    assert "password" not in first["ledger"] or "***" in first["ledger"]
    assert ledger_dump(cli_db.db_url)["step_run"] == []


# --------------------------------------------------------------------------- add-episode
def test_add_episode_copies_story_writes_default_config_and_registers(cli: CliEnv) -> None:
    story = cli.story("fox")
    payload = cli.json("add-episode", "--project", "p1", "--episode", "e1", "--story", str(story))
    assert payload["ok"] and payload["partition"] == "p1/e1"
    target = cli.home / "projects/p1/episodes/e1/story.md"
    assert target.read_bytes() == story.read_bytes()
    config = yaml.safe_load((cli.home / "projects/p1/project.yaml").read_text())
    assert ProjectConfig.model_validate(config) == ProjectConfig()
    assert instance_of(cli).has_dynamic_partition("episodes", "p1/e1")
    assert not list(target.parent.glob(".*.tmp")), "atomic copy leaves no temp files"

    again = cli.json("add-episode", "--project", "p1", "--episode", "e1", "--story", str(story))
    assert again["story_state"] == "unchanged"
    assert again["partition_registered"] == "already registered"

    other = cli.story("ship")
    refused = cli.invoke("add-episode", "--project", "p1", "--episode", "e1", "--story", str(other))
    assert refused.exit_code == 1
    assert "[input.story_exists]" in one_line_error(refused.stderr)
    assert target.read_bytes() == story.read_bytes()
    cli.ok("add-episode", "--project", "p1", "--episode", "e1", "--story", str(other), "--replace")
    assert target.read_bytes() == other.read_bytes()


@pytest.mark.parametrize(
    ("project", "episode", "culprit"),
    [
        ("..", "e1", "project_id"),
        ("p1", "../../etc", "episode_id"),
        ("p 1", "e1", "project_id"),
        ("p1", "a/b", "episode_id"),
        ("x" * 65, "e1", "project_id"),
    ],
)
def test_add_episode_refuses_bad_ids_before_touching_any_path(
    cli: CliEnv, project: str, episode: str, culprit: str
) -> None:
    story = cli.story("fox")
    before = tree_snapshot(cli.root)
    result = cli.invoke(
        "add-episode", "--project", project, "--episode", episode, "--story", str(story)
    )
    assert result.exit_code == 1
    line = one_line_error(result.stderr)
    assert "[input.invalid_id]" in line and culprit in line
    assert tree_snapshot(cli.root) == before, "nothing may be created for a refused id"


def test_add_episode_needs_a_dagster_home(cli: CliEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    # Run from a directory of the test's own: the checkout may hold the demo's
    # ``.dagster_home`` (``make demo`` before ``make test``), which the CLI would find there.
    monkeypatch.chdir(cli.root)
    story = cli.story("fox")
    result = cli.invoke(
        "add-episode", "--project", "p1", "--episode", "e1", "--story", str(story),
        env={"DAGSTER_HOME": None},
    )  # fmt: skip
    assert result.exit_code == 1
    assert "[config.dagster_home]" in one_line_error(result.stderr)
    assert not (cli.home / "projects").exists()


def test_the_demos_dagster_home_is_found_without_make(
    cli: CliEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After ``make demo`` the project directory holds ``.dagster_home``; the CLI run from
    there without make's environment uses it (as PIPELINE_HOME defaults to ./.pipeline)."""
    import dagster as dg

    demo_home = cli.root / ".dagster_home"
    demo_home.mkdir()
    (demo_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.chdir(cli.root)
    story = cli.story("fox")
    result = cli.invoke(
        "add-episode", "--project", "p1", "--episode", "e1", "--story", str(story),
        env={"DAGSTER_HOME": None},
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    instance = dg.DagsterInstance.from_config(str(demo_home))
    try:
        assert instance.get_dynamic_partitions("episodes") == ["p1/e1"]
    finally:
        instance.dispose()


def test_add_episode_refuses_a_missing_or_binary_story(cli: CliEnv) -> None:
    missing = cli.invoke(
        "add-episode", "--project", "p1", "--episode", "e1", "--story", str(cli.root / "nope.md")
    )
    assert missing.exit_code == 1 and "nope.md" in one_line_error(missing.stderr)
    binary = cli.root / "blob.md"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    result = cli.invoke("add-episode", "--project", "p1", "--episode", "e1", "--story", str(binary))
    assert result.exit_code == 1 and "NUL bytes" in one_line_error(result.stderr)


# --------------------------------------------------------------------------- runs and status
def test_a_materialize_in_process_holds_its_run_lease_and_ends_it(cli_db: CliEnv) -> None:
    """Run leases (docs/DESIGN.md#run-leases): the CLI is the coordinator of its in-process
    run; it takes the run's lease, renews it, and ends it when the run ends."""
    add(cli_db, "p1", "e1")
    done = cli_db.json("materialize", "--partition", "p1/e1")
    assert done["ok"]
    leases = cli_db.ledger.run_leases([done["run_id"]])
    lease = leases[done["run_id"]]
    assert lease.ended_at is not None and lease.ended_at >= lease.heartbeat_at, lease
    assert done["run_id"] not in cli_db.ledger.run_leases(open_only=True)


def test_materialize_then_resume_then_status(cli: CliEnv) -> None:
    add(cli, "p1", "e1")
    first = cli.json("materialize", "--partition", "p1/e1")
    assert first["ok"] and first["launch_path"] == "cli"
    by_step = {s["step"]: s for s in first["steps"]}
    # a first run re-runs nothing: the run report says so
    assert {s: by_step[s]["decision"] for s in by_step} == dict.fromkeys(by_step, "first_run")
    assert {s: by_step[s]["provider_calls"] for s in by_step} == {
        "source": 0,
        "outline": 3,
        "sketch": 3,
        "probe": 1,
    }
    assert all(by_step[s]["status"] == "completed" for s in by_step)

    second = cli.json("materialize", "--partition", "p1/e1")
    assert {s["decision"] for s in second["steps"]} == {"skip"}
    assert second["provider_calls"] == 0

    status = cli.json("status")
    rows = {(r["partition"], r["step"]): r for r in status["steps"]}
    assert rows["p1/e1", "outline"]["last_decision"] == "skip"
    assert rows["p1/e1", "outline"]["provider_calls"] == 3
    # The step in its run (the run's events), as the run report said it; and its claim to
    # its end (the ledger's), a part of it.
    for step_id, reported in by_step.items():
        shown = rows["p1/e1", step_id]["last_run_step_seconds"]
        assert shown == pytest.approx(reported["duration_seconds"], abs=0.002), step_id
        claimed = rows["p1/e1", step_id]["last_claimed_seconds"]
        assert claimed is not None and claimed <= shown + 0.002, step_id
    # Who ran it: the worker (host:pid) named by each step's claim line, this process here.
    here = f"{socket.gethostname()}:{os.getpid()}"
    assert {r["worker"] for r in status["steps"]} == {here}
    totals = status["totals"]
    assert totals["completed"] == 4 and totals["running"] == totals["failed"] == 0
    assert totals["provider_calls"] == 7 and totals["queued_runs"] == 0
    assert set(status["p95_claimed_seconds"]) == {"source", "outline", "sketch", "probe"}

    text = cli.ok("status").stdout
    assert "p1/e1" in text and "claimed p95 per step" in text


def test_status_shows_blocks_recoveries_and_pending(cli: CliEnv) -> None:
    add(cli, "p1", "e1")
    cli.ok("materialize", "--partition", "p1/e1")
    config = cli.home / "projects/p1/project.yaml"
    data = yaml.safe_load(config.read_text())
    data["scenes"]["camera_style"] = "extreme close-up"
    config.write_text(yaml.safe_dump(data))
    blocked = cli.invoke("materialize", "--partition", "p1/e1", "--step", "outline")
    assert blocked.exit_code == 1
    assert "[step.resume_blocked]" in one_line_error(blocked.stderr)
    assert "scenes.camera_style" in one_line_error(blocked.stderr)
    cli.ok("force", "--partition", "p1/e1", "--step", "outline")  # sketch becomes stale

    failed = StepKey("p1", "e1", "probe")
    ledger = cli.ledger
    assert ledger.claim(failed, "crashed:0", auto_recovery=True, reason="auto recovery from failed")
    assert ledger.transition(failed, "crashed:0", "failed", error="boom")
    assert ledger.set_retry_not_before(failed, "crashed:0", "2099-01-01T00:00:00.000000Z")

    status = cli.json("status", "--partition", "p1/e1")
    rows = {r["step"]: r for r in status["steps"]}
    assert rows["outline"]["last_decision"] == "force_explicit"
    # Invalidated by the force: stored as "stale", shown with its own word.
    assert rows["sketch"]["status"] == "invalidated"
    assert rows["sketch"]["ledger_status"] == "stale"
    assert rows["probe"]["recovery_count"] == 1
    assert rows["probe"]["retry_not_before"] == "2099-01-01T00:00:00.000000Z"
    assert rows["probe"]["error"] == "boom"
    totals = status["totals"]
    assert (totals["pending"], totals["failed"], totals["blocked"]) == (1, 1, 0)
    assert totals["oldest_pending_age_seconds"] is not None


def test_status_reports_a_blocked_step_with_origin_and_reason(cli: CliEnv) -> None:
    add(cli, "p1", "e1")
    cli.ok("materialize", "--partition", "p1/e1")
    config = cli.home / "projects/p1/project.yaml"
    data = yaml.safe_load(config.read_text())
    data["scenes"]["camera_style"] = "wide"
    config.write_text(yaml.safe_dump(data))
    assert cli.invoke("materialize", "--partition", "p1/e1").exit_code == 1
    status = cli.json("status")
    outline = next(r for r in status["steps"] if r["step"] == "outline")
    assert outline["last_decision"] == "block"
    assert outline["block_origin"] == "contract_drift"
    assert "scenes.camera_style" in outline["block_reason"]
    assert status["totals"]["blocked"] == 1
    assert "contract_drift" in cli.ok("status").stdout


def test_read_only_commands_refuse_an_unmigrated_ledger(cli: CliEnv) -> None:
    for command in ("status", "decide", "audit-running"):
        result = cli.invoke(command)
        assert result.exit_code == 1
        assert "[ledger.not_migrated]" in one_line_error(result.stderr)
    assert not (cli.home / "ledger.sqlite3").exists(), "a read-only command created the ledger"


# --------------------------------------------------------------------------- decide
def test_decide_is_a_shadow_with_zero_writes(cli_db: CliEnv) -> None:
    cli = cli_db
    add(cli, "p1", "e1")
    cli.ok("materialize", "--partition", "p1/e1")
    (cli.home / "checkpoints/p1/e1/sketch/checkpoint.json").unlink()  # completed, file gone
    add(cli, "p2", "e1", "ship")
    cli.ok("materialize", "--partition", "p2/e1")
    config = cli.home / "projects/p2/project.yaml"
    data = yaml.safe_load(config.read_text())
    data["scenes"]["camera_style"] = "wide"
    config.write_text(yaml.safe_dump(data))
    ledger = cli.ledger
    assert ledger.claim(StepKey("p2", "e1", "probe"), "someone:0")  # running healthy
    add(cli, "p3", "e1")  # registered, never run

    ledger_before = ledger_dump(cli.db_url)
    tree_before = tree_snapshot(cli.home)
    text = cli.ok("decide", "--all").stdout
    payload = cli.json("decide")
    also = cli.json("decide", "--partition", "p1/e1")
    assert ledger_dump(cli.db_url) == ledger_before
    assert tree_snapshot(cli.home) == tree_before

    assert "shadow decision (no writes)" in text
    got = {(d["partition"], d["step"]): d for d in payload["decisions"]}
    assert got["p1/e1", "sketch"]["verdict"] == "launch"
    assert got["p1/e1", "sketch"]["action"] == "rerun_self"
    assert got["p1/e1", "sketch"]["origin"] == "artifact_missing"
    assert got["p1/e1", "outline"]["verdict"] == "skip"
    assert got["p2/e1", "outline"]["verdict"] == "blocked"
    assert got["p2/e1", "outline"]["origin"] == "contract_drift"
    assert "scenes.camera_style" in got["p2/e1", "outline"]["reason"]
    assert got["p2/e1", "sketch"]["verdict"] == "skip"
    assert got["p2/e1", "probe"]["verdict"] == "running"
    assert "running healthy" in got["p2/e1", "probe"]["reason"]
    assert got["p3/e1", "source"]["verdict"] == "launch"
    # One run per partition (docs/DESIGN.md#sensor): outline goes in source's run.
    assert got["p3/e1", "outline"]["verdict"] == "launch"
    assert got["p3/e1", "outline"]["after"] == ["source"]
    assert got["p3/e1", "outline"]["run_key"] == got["p3/e1", "source"]["run_key"]
    assert payload["counts"]["launch"] == 5  # p1/e1 sketch; p3/e1's four steps
    assert {d["partition"] for d in also["decisions"]} == {"p1/e1"}


# --------------------------------------------------------------------------- running rows
def _set_started_at(url: str, key: StepKey, value: str | None) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.update(step_run)
            .where(
                step_run.c.project_id == key.project_id,
                step_run.c.episode_id == key.episode_id,
                step_run.c.step_id == key.step_id,
            )
            .values(started_at=value)
        )
    engine.dispose()


def test_audit_running_buckets_every_running_row(cli_db: CliEnv) -> None:
    cli = cli_db
    cli.ok("migrate")
    ledger = cli.ledger
    now = datetime.now(UTC)
    keys = {
        "healthy": StepKey("p1", "e1", "outline"),
        "lease_expired": StepKey("p1", "e2", "outline"),
        "unparseable": StepKey("p1", "e3", "outline"),
        "null_started_at": StepKey("p1", "e4", "outline"),
    }
    ledger.claim(keys["healthy"], "r1:0", now=format_timestamp(now - timedelta(seconds=30)))
    ledger.claim(keys["lease_expired"], "r2:0", now=format_timestamp(now - timedelta(hours=5)))
    ledger.claim(keys["unparseable"], "r3:0")
    ledger.claim(keys["null_started_at"], "r4:0")
    ledger.claim(StepKey("p1", "e5", "outline"), "r5:0")
    ledger.transition(StepKey("p1", "e5", "outline"), "r5:0", "completed")  # not running
    _set_started_at(cli.db_url, keys["unparseable"], "yesterday at noon")
    _set_started_at(cli.db_url, keys["null_started_at"], None)

    payload = cli.json("audit-running")
    rows = {r["partition"]: r for r in payload["running"]}
    assert {r["bucket"] for r in rows.values()} == set(keys)
    assert {rows[k.partition_key]["bucket"] for k in keys.values()} == set(keys)
    assert [rows[keys[b].partition_key]["bucket"] for b in keys] == list(keys)
    assert 25 <= rows["p1/e1"]["elapsed_seconds"] < 600
    assert rows["p1/e2"]["elapsed_seconds"] >= 5 * 3600 - 5
    assert rows["p1/e3"]["elapsed_seconds"] is None
    assert rows["p1/e3"]["started_at"] == "yesterday at noon"
    assert rows["p1/e4"]["started_at"] is None
    assert payload["counts"] == {**dict.fromkeys(keys, 1), "future": 0, "dead_owner": 0}
    text = cli.ok("audit-running").stdout
    assert "null_started_at" in text and "yesterday at noon" in text


def test_reset_running_is_an_expected_match(cli_db: CliEnv) -> None:
    cli = cli_db
    cli.ok("migrate")
    ledger = cli.ledger
    key = StepKey("p1", "e1", "outline")
    started = format_timestamp(datetime.now(UTC) - timedelta(hours=3))
    ledger.claim(key, "dead:0", now=started)
    before = ledger.get(key)

    wrong = cli.invoke(
        "reset-running", "--partition", "p1/e1", "--step", "outline",
        "--expected-started-at", "2020-01-01T00:00:00.000000Z",
    )  # fmt: skip
    assert wrong.exit_code == 1
    assert "[step.reset_refused]" in one_line_error(wrong.stderr)
    assert ledger.get(key) == before

    both = cli.invoke("reset-running", "--partition", "p1/e1", "--step", "outline")
    assert both.exit_code == 1 and "exactly one of" in one_line_error(both.stderr)

    done = cli.json(
        "reset-running", "--partition", "p1/e1", "--step", "outline",
        "--expected-started-at", started, "--reason", "worker host died",
    )  # fmt: skip
    assert done["ok"] and done["previous_run_id"] == "dead:0"
    row = ledger.get(key)
    assert row is not None and row.status == "failed"
    assert row.error_message == "worker host died"
    audit = ledger.transitions(key)[-1]
    assert (audit.action, audit.from_status, audit.to_status) == (
        "reset_running",
        "running",
        "failed",
    )
    again = cli.invoke(
        "reset-running", "--partition", "p1/e1", "--step", "outline",
        "--expected-started-at", started,
    )  # fmt: skip
    assert again.exit_code == 1, "a row that is no longer running is refused"

    null_key = StepKey("p1", "e2", "outline")
    ledger.claim(null_key, "ghost:0")
    _set_started_at(cli.db_url, null_key, None)
    cli.ok("reset-running", "--partition", "p1/e2", "--step", "outline", "--null-started-at")
    released = ledger.get(null_key)
    assert released is not None and released.status == "failed"


# --------------------------------------------------------------------------- force
def test_force_runs_one_step_with_the_force_tag_and_invalidates_downstream(cli: CliEnv) -> None:
    add(cli, "p1", "e1")
    cli.ok("materialize", "--partition", "p1/e1")
    payload = cli.json("force", "--partition", "p1/e1", "--step", "outline")
    assert payload["ok"]
    assert [(s["step"], s["decision"]) for s in payload["steps"]] == [("outline", "force_explicit")]
    assert payload["provider_calls"] == 3
    run = instance_of(cli).get_run_by_id(payload["run_id"])
    assert run is not None
    assert run.tags["resume/mode"] == "force"
    assert run.tags["resume/launch_path"] == "cli"
    assert run.tags["dagster/partition"] == "p1/e1"
    ledger = cli.ledger
    sketch = ledger.get(StepKey("p1", "e1", "sketch"))
    assert sketch is not None and sketch.status == "stale"
    audit = [
        t for t in ledger.transitions() if run_token_of(str(t.run_id)) == f"{payload['run_id']}:0"
    ]
    assert {t.action for t in audit} >= {"force_explicit", "invalidate", "finish"}
    assert {t.launch_path for t in audit} == {"cli"}

    resumed = cli.json("materialize", "--partition", "p1/e1")
    decisions = {s["step"]: s["decision"] for s in resumed["steps"]}
    assert decisions == {
        "source": "skip",
        "outline": "skip",
        "sketch": "rerun_self",
        "probe": "skip",
    }


def test_force_names_the_culprit(cli: CliEnv) -> None:
    add(cli, "p1", "e1")
    unknown = cli.invoke("force", "--partition", "p1/e1", "--step", "nope")
    assert unknown.exit_code == 1
    assert "unknown step 'nope'" in one_line_error(unknown.stderr)
    unregistered = cli.invoke("force", "--partition", "p1/e9", "--step", "outline")
    assert unregistered.exit_code == 1
    assert "'p1/e9' is not registered" in one_line_error(unregistered.stderr)
    malformed = cli.invoke("force", "--partition", "p1", "--step", "outline")
    assert malformed.exit_code == 1 and "[input.invalid_id]" in one_line_error(malformed.stderr)
    gated = cli.invoke("force", "--partition", "p1/e1", "--step", "outline", "--json")
    assert gated.exit_code == 1
    payload = json.loads(gated.stdout)
    assert payload["ok"] is False and payload["error"]["code"] == "step.gate_blocked"


def test_graphql_force_reports_an_unreachable_webserver(cli: CliEnv) -> None:
    add(cli, "p1", "e1")
    result = cli.invoke(
        "force", "--partition", "p1/e1", "--step", "source", "--graphql", "http://127.0.0.1:9"
    )
    assert result.exit_code == 1
    assert "[launch.graphql_failed]" in one_line_error(result.stderr)


# --------------------------------------------------------------------------- plumbing
def test_a_bad_definitions_spec_is_one_clear_line(cli: CliEnv) -> None:
    result = cli.invoke("status", "--json", env={"STORYBOARD_DEFS": "no_such_module:defs"})
    assert result.exit_code == 1
    assert "STORYBOARD_DEFS='no_such_module:defs'" in one_line_error(result.stderr)
    assert json.loads(result.stdout)["error"]["code"] == "input.invalid"


def test_the_console_script_runs_and_fails_with_exit_codes(cli: CliEnv) -> None:
    script = Path(sys.executable).with_name("storyboard")
    env = cli.subprocess_env()
    done = subprocess.run(
        [str(script), "migrate", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["revision"] == ledger_head()
    story = cli.story("fox")
    refused = subprocess.run(
        [str(script), "add-episode", "--project", "a b", "--episode", "e", "--story", str(story)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1
    assert one_line_error(refused.stderr).startswith("error: [input.invalid_id] invalid project_id")
    usage = subprocess.run(
        [str(script), "force", "--partition", "p/e"], env=env, capture_output=True, text=True
    )
    assert usage.returncode == 2 and "--step" in usage.stderr
