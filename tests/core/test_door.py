"""refuse at the door what would be refused later, driven as a user would.

Each case goes through the operator CLI (``storyboard`` via click's runner, real
``PIPELINE_*`` variables, real ``project.yaml`` files, a real ledger) or a real process:
project knobs without an upper bound, ids that start with ``-``, a misspelt
``PIPELINE_CRASH_AT``, a heartbeat stamped in the future, and an API key asked for by
steps that call no model.
"""

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from cli_helpers import CliEnv, make_env
from openai_server import FakeOpenAI, serving

from pipeline_defs.resume.clock import MAX_CLOCK_SKEW, format_timestamp
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow
from resources.ledger.tables import step_run

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = "pipeline_defs.definitions:defs"


def _one_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


def _write_project(cli: CliEnv, project: str, config: dict[str, Any] | str) -> Path:
    path = cli.home / "projects" / project / "project.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else yaml.safe_dump(config)
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------ unbounded project knobs (3)
@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("story:\n  segment_chars: 100000000000000000000000000000\n", "story.segment_chars"),
        ("story:\n  segment_chars: 1.0e+29\n", "story.segment_chars"),
        ("story:\n  max_bytes: 100000000000000000000000000000\n", "story.max_bytes"),
        ("entities:\n  min_mentions: 100000000000000000000000000000\n", "entities.min_mentions"),
        ("images:\n  ref_min_mentions: 10000000000\n", "images.ref_min_mentions"),
        ("provider:\n  timeout_seconds: 1.0e+300\n", "provider.timeout_seconds"),
        ("provider:\n  timeout_seconds: .inf\n", "provider.timeout_seconds"),
    ],
)
def test_an_unbounded_knob_is_refused_naming_the_file_and_key(
    cli: CliEnv, yaml_text: str, key: str
) -> None:
    path = _write_project(cli, "p1", yaml_text)
    story = cli.story("fox")
    result = cli.invoke("add-episode", "--project", "p1", "--episode", "e1", "--story", str(story))
    assert result.exit_code == 1, result.output
    line = _one_error(result.stderr)
    assert line.startswith("error: [config.invalid]"), line
    assert f"{path}: {key}:" in line, line
    assert not (cli.home / "projects" / "p1" / "episodes").exists()


def test_the_bounds_themselves_and_the_template_are_accepted(cli: CliEnv) -> None:
    from pipeline_defs.project import (
        MAX_MENTIONS,
        MAX_PROVIDER_TIMEOUT_SECONDS,
        MAX_SEGMENT_CHARS,
        MAX_STORY_BYTES,
    )

    _write_project(
        cli,
        "p1",
        {
            "story": {"max_bytes": MAX_STORY_BYTES, "segment_chars": MAX_SEGMENT_CHARS},
            "entities": {"min_mentions": MAX_MENTIONS},
            "images": {"ref_min_mentions": MAX_MENTIONS},
            "provider": {"timeout_seconds": MAX_PROVIDER_TIMEOUT_SECONDS},
        },
    )
    story = cli.story("fox")
    cli.ok("add-episode", "--project", "p1", "--episode", "e1", "--story", str(story))
    cli.ok("add-episode", "--project", "p2", "--episode", "e1", "--story", str(story))


# ------------------------------------------------------------ ids starting with "-" (4)
@pytest.mark.parametrize(
    ("project", "episode", "culprit"),
    [("-rf", "e1", "project_id"), ("p1", "-e1", "episode_id"), ("--help", "e1", "project_id")],
)
def test_an_id_starting_with_a_dash_is_refused_before_any_path(
    cli: CliEnv, project: str, episode: str, culprit: str
) -> None:
    story = cli.story("fox")
    result = cli.invoke(
        "add-episode", f"--project={project}", f"--episode={episode}", "--story", str(story)
    )
    assert result.exit_code == 1, result.output
    line = _one_error(result.stderr)
    assert line.startswith("error: [input.invalid_id]"), line
    assert culprit in line and "must not start with '-'" in line, line
    assert not (cli.home / "projects").exists()


def test_the_example_from_the_issue_is_refused(cli: CliEnv) -> None:
    story = cli.story("fox")
    result = cli.invoke("add-episode", "--project", "-rf", "--episode", "e1", "--story", str(story))
    assert result.exit_code == 1, result.output
    assert "[input.invalid_id]" in _one_error(result.stderr)
    assert not (cli.home / "projects").exists()


def test_a_dash_inside_an_id_is_still_fine(cli: CliEnv) -> None:
    story = cli.story("fox")
    cli.ok("add-episode", "--project", "my-proj_1", "--episode", "ep-01-", "--story", str(story))


# ------------------------------------------------------------ PIPELINE_CRASH_AT (5)
@pytest.mark.parametrize(
    "value",
    ["nonsense", "story_source:nonsense", "claimed:story_source", ":claimed", "a b:claimed"],
)
def test_a_crash_point_naming_no_stage_refuses_the_cli_at_start(cli: CliEnv, value: str) -> None:
    result = cli.invoke("migrate", env={"PIPELINE_CRASH_AT": value})
    assert result.exit_code == 1, result.output
    line = _one_error(result.stderr)
    assert line.startswith("error: [settings.invalid]"), line
    assert f"PIPELINE_CRASH_AT={value!r}" in line and "claimed" in line, line
    assert not (cli.home / "ledger.sqlite3").exists()


@pytest.mark.parametrize("value", ["claimed", "story_source:published", "t2i_review:finished"])
def test_a_well_formed_crash_point_is_accepted(cli: CliEnv, value: str) -> None:
    result = cli.invoke("migrate", env={"PIPELINE_CRASH_AT": value})
    assert result.exit_code == 0, result.output


def test_a_crash_point_naming_no_stage_refuses_the_code_location(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "DAGSTER_HOME": str(tmp_path),
        "PIPELINE_CRASH_AT": "nonsense",
    }
    result = subprocess.run(
        [sys.executable, "-c", "import pipeline_defs; pipeline_defs.defs"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "PIPELINE_CRASH_AT" in result.stderr and "settings.invalid" in result.stderr


# ------------------------------------------------------------ a heartbeat from the future (7)
def _set_heartbeat(url: str, key: StepKey, value: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.update(step_run)
            .where(
                step_run.c.project_id == key.project_id,
                step_run.c.episode_id == key.episode_id,
                step_run.c.step_id == key.step_id,
            )
            .values(heartbeat_at=value)
        )
    engine.dispose()


def test_audit_running_puts_a_future_heartbeat_in_future_not_healthy(
    tmp_path: Path, db_url: str
) -> None:
    cli = make_env(tmp_path, db_url)
    cli.ok("migrate")
    now = datetime.now(UTC)
    renewed = StepKey("p1", "e1", "outline")
    slightly_ahead = StepKey("p1", "e2", "outline")
    far = StepKey("p1", "e3", "outline")
    for key in (renewed, slightly_ahead, far):
        assert cli.ledger.claim(key, f"run-{key.episode_id}:0", now=format_timestamp(now))
    _set_heartbeat(cli.db_url, slightly_ahead, format_timestamp(now + timedelta(seconds=60)))
    _set_heartbeat(cli.db_url, far, "9999-12-31T23:59:59.000000Z")

    payload = cli.json("audit-running")
    rows = {r["partition"]: r for r in payload["running"]}
    assert rows["p1/e1"]["bucket"] == "healthy"
    assert rows["p1/e2"]["bucket"] == "healthy"  # within the allowed clock skew
    row = rows["p1/e3"]
    assert row["bucket"] == "future", row
    assert "heartbeat_at" in row["hint"] and "in the future" in row["hint"], row
    assert "--expected-started-at" in row["hint"], row
    assert payload["counts"]["future"] == 1


def test_a_heartbeat_beyond_the_skew_is_no_healthy_lease_for_the_judge() -> None:
    """The same judgement ``decide`` makes for the sensor (pure; see test_decision_table)."""
    from pipeline_defs.resume.completion import CompletionReport
    from pipeline_defs.resume.decision import decide
    from pipeline_defs.resume.decision_types import (
        CheckpointSummary,
        LaunchMode,
        ResumeAction,
        ScopedConfig,
    )
    from pipeline_defs.resume.settings import ResumeSettings

    class _Step:
        step_id = "outline"
        schema_version = 1
        resume_config_keys: tuple[str, ...] = ()
        allow_auto_rerun_on_schema_bump = False

    now = datetime(2026, 11, 30, 13, 0, 0, tzinfo=UTC)

    def judge(beat: str, owner_ended: str | None = None) -> Any:
        def never() -> CompletionReport:
            raise AssertionError("a running row is judged without verification")

        return decide(
            mode=LaunchMode.RESUME,
            applicable=True,
            row=LedgerRow(
                status="running",
                run_id="run-1:a1",
                started_at=format_timestamp(now - timedelta(seconds=5)),
                heartbeat_at=beat,
                recovery_count=0,
                last_recovery_reason=None,
                retry_not_before=None,
            ),
            checkpoint=CheckpointSummary.absent(),
            verify=never,
            step=_Step(),
            config=ScopedConfig(),
            settings=ResumeSettings(),
            now=now,
            owner_ended=owner_ended,
        )

    future = format_timestamp(now + MAX_CLOCK_SKEW + timedelta(seconds=1))
    blocked = judge(future)
    assert blocked.action is ResumeAction.BLOCK and blocked.code == "step.resume_blocked"
    assert "heartbeat_at" in blocked.reason and "manual investigation required" in blocked.reason
    assert judge(format_timestamp(now + MAX_CLOCK_SKEW)).code == "step.already_running"
    # An ended owner renews nothing, whatever its heartbeat says: recovered, as before.
    ended = judge(future, owner_ended="FAILURE")
    assert ended.action is ResumeAction.STALE_RUNNING_RECOVERY
    assert ended.expected_heartbeat_at == future


# ------------------------------------------------------------ the API key (8)
KEY_ENV = "SB_DOOR_PROVIDER_KEY"
PARTITION = "p1/e1"


@pytest.fixture
def fake_openai() -> Iterator[FakeOpenAI]:
    with serving(fallback=True) as fake:
        yield fake


@pytest.fixture
def openai_cli(cli: CliEnv, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> CliEnv:
    """The shipped code location; project p1 asks for an OpenAI-compatible endpoint."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    cli.defs = SHIPPED
    _write_project(
        cli,
        "p1",
        {
            "provider": {
                "kind": "openai",
                "base_url": fake_openai.base_url,
                "text_model": "gpt-door-text",
                "image_model": "gpt-door-image",
                "timeout_seconds": 5,
                "api_key_env": KEY_ENV,
            }
        },
    )
    cli.ok("add-episode", "--project", "p1", "--episode", "e1", "--story", str(cli.story("fox")))
    return cli


def _materialize(cli: CliEnv, *steps: str, key: str | None = None) -> tuple[int, dict[str, Any]]:
    args = ["materialize", "--partition", PARTITION, "--json"]
    for step in steps:
        args += ["--step", step]
    result = cli.invoke(*args, env={KEY_ENV: key})
    return result.exit_code, json.loads(result.stdout)


def _statuses(cli: CliEnv) -> dict[str, str]:
    return {k.step_id: str(r.status) for k, r in cli.ledger.get_many().items()}


def test_story_source_calls_no_model_and_needs_no_key(
    openai_cli: CliEnv, fake_openai: FakeOpenAI
) -> None:
    code, report = _materialize(openai_cli, "story_source")
    assert code == 0, report
    assert _statuses(openai_cli) == {"story_source": "completed"}
    assert fake_openai.requests == [] and openai_cli.ledger.provider_calls() == []


def test_a_step_that_would_call_a_model_is_refused_before_its_claim(
    openai_cli: CliEnv, fake_openai: FakeOpenAI
) -> None:
    code, report = _materialize(openai_cli)
    assert code == 1
    assert report["error"]["code"] == "provider.no_key"
    assert KEY_ENV in report["error"]["message"]
    assert _statuses(openai_cli) == {"story_source": "completed"}  # nothing else claimed
    assert fake_openai.requests == [] and openai_cli.ledger.provider_calls() == []


def test_a_step_that_would_skip_needs_no_key(openai_cli: CliEnv, fake_openai: FakeOpenAI) -> None:
    code, report = _materialize(openai_cli, "story_source", "entity_canon", key="sk-door-1")
    assert code == 0, report
    assert _statuses(openai_cli) == {"story_source": "completed", "entity_canon": "completed"}
    sent = len(fake_openai.requests)
    assert sent > 0

    code, report = _materialize(openai_cli, "story_source", "entity_canon")  # no key now
    assert code == 0, report
    assert {s["step"]: s["decision"] for s in report["steps"]} == {
        "story_source": "skip",
        "entity_canon": "skip",
    }
    assert len(fake_openai.requests) == sent
    instance = dg.DagsterInstance.from_config(str(openai_cli.dagster_home))
    assert len(instance.get_runs()) == 2
