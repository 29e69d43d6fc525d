"""Every surface says what is true.

- ``storyboard status | head`` ends quietly: a reader that went away is a normal end.
- ``make dev PORT=3001`` starts the UI on that port.
- A first run is shown as ``first_run``, not as a re-run.
- "stale" meant two things: a row a force invalidated is shown ``invalidated``, a lapsed
  lease ``lease_expired`` (the ledger keeps storing ``stale``).
- A refused claim judges the row's owner by its lease, as ``audit-running`` does.
"""

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import sqlalchemy as sa
from cli_helpers import ROOT, CliEnv, ledger_dump
from sensor_steps import snapshot, stores_for

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.partition import StepKey
from resources.ledger.tables import step_run

SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for `git log | head`'s git


def add(cli: CliEnv, project: str, episode: str = "e1") -> None:
    story = str(cli.story("fox"))
    cli.ok("add-episode", "--project", project, "--episode", episode, "--story", story)


def set_row(cli: CliEnv, key: StepKey, **values: str | None) -> None:
    """Test-only edit of a ledger row (a lease's timestamps)."""
    with cli.ledger.engine.begin() as conn:
        conn.execute(
            sa.update(step_run)
            .where(
                step_run.c.project_id == key.project_id,
                step_run.c.episode_id == key.episode_id,
                step_run.c.step_id == key.step_id,
            )
            .values(**values)
        )


def wide(cli: CliEnv, *args: str) -> str:
    """A command's human output on a terminal wide enough for one line per table row."""
    result = cli.invoke(*args, env={"COLUMNS": "250"})
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


def column(text: str, header: str) -> dict[tuple[str, str], str]:
    """(partition, step) → the value in ``header``'s column of a rendered table."""
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("partition"))
    spans = [m.span() for m in re.finditer(r"-+", lines[head + 1])]
    start, end = spans[[lines[head][a:b].strip() for a, b in spans].index(header)]
    out = {}
    for line in lines[head + 2 :]:
        if re.match(r"\S+/\S+\s", line):  # a row (a wrapped reason's lines start blank)
            partition, step = line.split()[:2]
            out[partition, step] = line[start:end].strip()
    return out


# --------------------------------------------------------------------------- 1. closed pipe
def test_status_piped_into_head_ends_quietly(cli: CliEnv) -> None:
    """The real console script, its output cut by ``head -1``: no ``[internal]
    BrokenPipeError`` line, and the exit status of a process SIGPIPE ended."""
    cli.ok("migrate")
    add(cli, "p1")
    # Far more than a pipe holds (64 KiB): the write is still going when head exits.
    instance = dg.DagsterInstance.from_config(str(cli.dagster_home))
    try:
        instance.add_dynamic_partitions("episodes", [f"p1/x{i:04d}" for i in range(300)])
    finally:
        instance.dispose()
    script = Path(sys.executable).with_name("storyboard")
    assert script.exists(), script
    # The table is one write that the closed pipe cuts short; the totals line after it is
    # the write that fails. (A lone huge write, as ``--json`` makes, is cut short without
    # an error reaching Python at all.)
    piped = subprocess.run(
        ["bash", "-c", f"{script} status | head -1; exit ${{PIPESTATUS[0]}}"],
        env=cli.subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cli.root,
    )
    assert piped.stderr == "", piped.stderr
    assert piped.returncode == SIGPIPE_EXIT, piped.returncode
    (first,) = piped.stdout.splitlines()  # head's one line: the start of the real output
    assert first.split()[:3] == ["partition", "step", "status"], first


# --------------------------------------------------------------------------- 2. make dev PORT
def test_make_dev_takes_a_port(tmp_path: Path) -> None:
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home")}
    env.pop("PORT", None)

    def dev_command(*overrides: str) -> str:
        done = subprocess.run(
            ["make", "-n", "-C", str(ROOT), "dev", *overrides],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        (line,) = [x for x in done.stdout.splitlines() if "dg dev" in x]
        return line

    assert dev_command().endswith("dg dev --port 3000")
    assert dev_command("PORT=3001").endswith("dg dev --port 3001")


# --------------------------------------------------------------------------- 3. first run
def test_a_first_run_is_shown_as_first_run(cli: CliEnv) -> None:
    add(cli, "p1")  # never run
    add(cli, "p2")
    cli.ok("materialize", "--partition", "p2/e1")  # every step's last decision: its first run
    (cli.home / "checkpoints/p2/e1/sketch/checkpoint.json").unlink()  # a real re-run

    decided = {(d["partition"], d["step"]): d for d in cli.json("decide", "--all")["decisions"]}
    first = decided["p1/e1", "source"]
    assert (first["action"], first["verdict"]) == ("first_run", "launch")
    assert first["reason"] == "first run"
    assert first["detail"] == "launch first_run"
    assert decided["p1/e1", "outline"]["action"] == "first_run"  # in the same run, after source
    assert decided["p1/e1", "outline"]["detail"].startswith("launch first_run, in one run after")
    assert decided["p2/e1", "sketch"]["action"] == "rerun_self"  # a re-run stays one
    text = wide(cli, "decide", "--all")
    actions = column(text, "action")
    assert actions["p1/e1", "source"] == "first_run"
    assert actions["p2/e1", "sketch"] == "rerun_self"
    assert "rerun_self" not in {v for (p, _), v in actions.items() if p == "p1/e1"}

    status = {(s["partition"], s["step"]): s for s in cli.json("status")["steps"]}
    assert {s["last_decision"] for k, s in status.items() if k[0] == "p2/e1"} == {"first_run"}
    shown = column(wide(cli, "status"), "last decision")
    assert {v for (p, _), v in shown.items() if p == "p2/e1"} == {"first_run"}


# --------------------------------------------------------------------------- 4. two "stale"s
def test_an_invalidated_row_and_a_lapsed_lease_have_two_words(cli: CliEnv) -> None:
    add(cli, "p1")
    cli.ok("materialize", "--partition", "p1/e1")
    cli.ok("force", "--partition", "p1/e1", "--step", "outline")  # sketch, probe: invalidated
    invalidated = StepKey("p1", "e1", "sketch")
    stored = cli.ledger.get(invalidated)
    assert stored is not None and stored.status == "stale", "the stored value stays"
    add(cli, "p2")
    lapsed = StepKey("p2", "e1", "source")
    long_ago = format_timestamp(datetime.now(UTC) - timedelta(hours=2))
    assert cli.ledger.claim(lapsed, "gone:0", now=long_ago)
    set_row(cli, lapsed, heartbeat_at=long_ago)

    status = {(s["partition"], s["step"]): s for s in cli.json("status")["steps"]}
    assert status["p1/e1", "sketch"]["status"] == "invalidated"
    assert status["p1/e1", "sketch"]["ledger_status"] == "stale"
    shown = column(wide(cli, "status"), "status")
    assert shown["p1/e1", "sketch"] == "invalidated"
    assert "stale" not in shown.values()

    decided = {(d["partition"], d["step"]): d for d in cli.json("decide", "--all")["decisions"]}
    assert "invalidated by an explicit force" in decided["p1/e1", "sketch"]["reason"]
    assert "stale" not in decided["p1/e1", "sketch"]["reason"]
    assert "expired lease" in decided["p2/e1", "source"]["reason"]
    assert "stale" not in decided["p2/e1", "source"]["reason"]

    audit = cli.json("audit-running")
    assert [r["bucket"] for r in audit["running"]] == ["lease_expired"]
    assert audit["counts"]["lease_expired"] == 1 and "stale" not in audit["counts"]
    text = wide(cli, "audit-running")
    assert "lease_expired" in text and "stale " not in text


# --------------------------------------------------------------------------- 5. refused claim
def test_a_refused_claim_judges_a_live_owner_by_its_lease(cli: CliEnv) -> None:
    """A force meets a step that started two hours ago and renewed its lease a moment ago:
    its owner is alive. The refusal must not call the lease STALE nor offer a reset."""
    add(cli, "p1")
    key = StepKey("p1", "e1", "source")
    started = format_timestamp(datetime.now(UTC) - timedelta(hours=2))
    assert cli.ledger.claim(key, "alive:0", now=started)
    set_row(cli, key, heartbeat_at=format_timestamp(datetime.now(UTC) - timedelta(seconds=5)))
    audited = cli.json("audit-running")["running"]
    assert [r["bucket"] for r in audited] == ["healthy"], audited  # the lease view

    refused = cli.invoke("force", "--partition", "p1/e1", "--step", "source", "--json")

    assert refused.exit_code == 1, refused.output
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "step.already_running", error
    message = error["message"]
    assert "alive:0" in message, message
    assert "STALE" not in message.upper().replace("STALE_RUNNING_RECOVERY", ""), message
    assert "reset-running" not in message, message
    assert "heartbeat" in message and "lease" in message, message


# --------------------------------------------------------------------------- 6. the docs
def test_the_docs_say_what_the_code_does() -> None:
    """A force after an image-model switch redraws (and pays for) every picture the old
    model drew (tests/e2e/test_providers_openai_e2e.py proves it); a dead worker's row is
    recovered as soon as its run has ended, a hung one's when its lease lapses."""
    texts = [
        (ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "docs/OPERATING.md")
    ]
    readme = " ".join(" ".join(texts).split())
    assert "A forced image step keeps its valid pictures" not in readme
    assert "A forced image step redraws every picture another image model drew" in readme
    assert "pays one new call per picture" in readme
    deploy = (ROOT / "deploy" / "dagster.yaml").read_text(encoding="utf-8")
    monitoring = " ".join(deploy.split("run_monitoring:")[0].rsplit("\n\n", 1)[-1].split())
    assert "until running_timeout_seconds" not in monitoring, monitoring
    assert "recovers it at its next tick" in monitoring and "lease_seconds" in monitoring


# --------------------------------------------------------------------------- §5 zero writes
def test_the_zero_writes_checks_see_a_settings_change(cli: CliEnv) -> None:
    """``ledger_dump`` (CLI tests) and ``snapshot`` (sensor tests) prove "writes nothing":
    a command that changed a ledger setting, or its audit, must not pass them."""
    cli.ok("migrate")
    stores = stores_for(cli.home, cli.db_url)
    before, sensor_before = ledger_dump(cli.db_url), snapshot(stores)
    assert {"settings", "setting_change"} <= set(before)

    cli.ok("settings", "set", "lease_seconds", "90")

    after = ledger_dump(cli.db_url)
    assert after != before and snapshot(stores) != sensor_before
    assert [r[:2] for r in after["settings"]] == [("lease_seconds", "90")]
    assert len(after["setting_change"]) == len(before["setting_change"]) + 1


def test_a_bad_project_file_is_reported_once_with_its_line_and_the_fix(cli: CliEnv) -> None:
    """A malformed project.yaml blocks every step of every episode of the project; the
    screens say so once, with the file, the line and the fix, not once per step."""
    cli.ok("migrate")
    add(cli, "p1", "e1")
    add(cli, "p1", "e2")
    config = cli.home / "projects" / "p1" / "project.yaml"
    config.write_text("title: x\nimage:\n  width: [1,\n", encoding="utf-8")
    for command in ("status", "decide"):
        text = " ".join(wide(cli, command).split())  # wrapped table cells, one line
        assert text.count("not valid YAML") == 2, text  # the block and its fix, once
        assert f"{config}, line 4, column 1" in text, text
        assert text.count("fix the project file") == 1, text
        assert "same as p1/e1 " in text, text  # the other steps point at the first
