"""An ``openai`` project end to end through the code location as shipped.

``storyboard materialize`` (``pipeline_defs.definitions:defs``, no resource override)
against a local OpenAI-compatible server started here, which answers like a real
endpoint (tests/support/openai_server.py) after scripted 429 bursts with Retry-After, 5xx,
a timeout and a malformed body. Every step completes or fails with a typed provider
error; the results name the model that produced them; the key is in no file the run
wrote, nor in the CLI's output.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_helpers import CliEnv, ledger_dump, make_env
from click.testing import Result
from openai_server import CHAT, IMAGES, FakeOpenAI, Reply, serving

from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.storyboard import STORYBOARD_STEPS, sample_stories
from resources.ledger.store import LedgerStore

API_KEY = "sk-e2e-SECRET-must-not-leak-0123456789"
KEY_ENV = "SB_E2E_PROVIDER_KEY"
TEXT_MODEL = "gpt-e2e-text"
IMAGE_MODEL = "gpt-e2e-image"
PROJECT, EPISODE = "p1", "ep01"
PARTITION = f"{PROJECT}/{EPISODE}"
SHIPPED = "pipeline_defs.definitions:defs"
STEPS = {s.step_id: s for s in STORYBOARD_STEPS}
TEXT_STEPS = {s for s, step in STEPS.items() if "provider.text_model" in step.resume_config_keys}
IMAGE_STEPS = {s for s, step in STEPS.items() if "provider.image_model" in step.resume_config_keys}
SOON = {"retry-after-ms": "10"}


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with serving(fallback=True) as fake:
        yield fake


@pytest.fixture
def shipped_cli(tmp_path: Path, server: FakeOpenAI, db_url: str) -> CliEnv:
    env = make_env(tmp_path, db_url)
    env.defs = SHIPPED
    config = {
        "image": {"width": 128, "height": 96},
        "images": {"ref_min_mentions": 3},
        "provider": {
            "kind": "openai",
            "base_url": server.base_url,
            "text_model": TEXT_MODEL,
            "image_model": IMAGE_MODEL,
            "timeout_seconds": 0.5,
            "api_key_env": KEY_ENV,
        },
    }
    path = env.home / "projects" / PROJECT / "project.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    story = sample_stories()[EPISODE]
    env.ok("add-episode", "--project", PROJECT, "--episode", EPISODE, "--story", str(story))
    return env


def materialize(shipped_cli: CliEnv, *, key: str | None = API_KEY) -> tuple[Result, dict[str, Any]]:
    result = shipped_cli.invoke(
        "materialize", "--partition", PARTITION, "--json", env={KEY_ENV: key}
    )
    return result, json.loads(result.stdout)


def rows(ledger: LedgerStore) -> dict[str, LedgerRow]:
    return {k.step_id: r for k, r in ledger.get_many().items()}


def assert_key_nowhere(shipped_cli: CliEnv, *outputs: Result) -> None:
    """Not in any file under the test's root (PIPELINE_HOME, DAGSTER_HOME, a SQLite
    ledger), not in any ledger row (PostgreSQL too), nor printed."""
    needle = API_KEY.encode()
    for path in shipped_cli.root.rglob("*"):
        if path.is_file():
            assert needle not in path.read_bytes(), path
    assert API_KEY not in repr(ledger_dump(shipped_cli.db_url))
    for result in outputs:
        assert API_KEY not in result.output
        assert API_KEY not in (result.stderr if result.stderr_bytes else "")


def test_openai_project_runs_through_the_shipped_defs(
    shipped_cli: CliEnv, server: FakeOpenAI
) -> None:
    server.script(
        CHAT,
        Reply(429, {"error": "rate limited"}, {"Retry-After": "0.05"}),
        Reply(429, {"error": "rate limited"}, {"Retry-After": "0.05"}),
        Reply(500, {"error": "upstream"}, SOON),
        Reply(200, b"{}", delay=1.5),  # past timeout_seconds: the attempt times out
    )
    server.script(
        IMAGES,
        Reply(503, b"busy", SOON),
        Reply(429, {"error": "rate limited"}, {"Retry-After": "0.05"}),
        Reply(429, {"error": "rate limited"}, {"Retry-After": "0.05"}),
    )

    result, report = materialize(shipped_cli)

    assert result.exit_code == 0, result.output
    assert report["ok"] is True
    ledger = shipped_cli.ledger
    by_step = rows(ledger)
    assert {s: r.status for s, r in by_step.items()} == dict.fromkeys(STEPS, "completed")
    # The project's models were called, with the key from the environment variable it names.
    chats, images = server.seen(CHAT), server.seen(IMAGES)
    assert {r.body["model"] for r in chats} == {TEXT_MODEL}
    assert {r.body["model"] for r in images} == {IMAGE_MODEL}
    assert {r.headers["authorization"] for r in [*chats, *images]} == {f"Bearer {API_KEY}"}
    # Every scripted fault was served and retried by the client: one ledger call each.
    assert server.scripts[CHAT] == [] and server.scripts[IMAGES] == []
    calls = ledger.provider_calls()
    assert len(chats) == sum(c["kind"] == "text" for c in calls) + 4
    assert len(images) == sum(c["kind"] == "image" for c in calls) + 3
    # The model that produced each result is recorded: the row, each call, each receipt.
    for step_id, row in by_step.items():
        expected = (
            TEXT_MODEL if step_id in TEXT_STEPS else IMAGE_MODEL if step_id in IMAGE_STEPS else None
        )
        assert row.resolved_model == expected, step_id
    assert calls and all(c["finished_at"] for c in calls)
    assert {c["model"] for c in calls if c["kind"] == "text"} == {TEXT_MODEL}
    assert {c["model"] for c in calls if c["kind"] == "image"} == {IMAGE_MODEL}
    # Units are the tokens the endpoint reported, not a count of calls.
    assert all(c["units"] > 1 for c in calls if c["kind"] == "text")
    assert {c["units"] for c in calls if c["kind"] == "image"} == {100}
    receipts = list(shipped_cli.home.rglob("*.receipt.json"))
    assert receipts
    assert {json.loads(p.read_text())["model"] for p in receipts} == {IMAGE_MODEL}
    assert_key_nowhere(shipped_cli, result)


def test_malformed_body_fails_the_step_typed(shipped_cli: CliEnv, server: FakeOpenAI) -> None:
    server.script(CHAT, Reply(200, b'{"choices": [{"message": '))

    result, report = materialize(shipped_cli)

    assert result.exit_code == 1
    assert report["ok"] is False
    assert report["error"]["code"] == "provider.bad_response"
    failed = {s["step"]: s for s in report["steps"] if s["outcome"] == "failed"}
    assert list(failed) == ["entity_canon"]
    assert failed["entity_canon"]["error_code"] == "provider.bad_response"
    by_step = rows(shipped_cli.ledger)
    assert by_step["story_source"].status == "completed"
    assert by_step["entity_canon"].status == "failed"
    assert "provider.bad_response" in (by_step["entity_canon"].error_message or "")
    (call,) = shipped_cli.ledger.provider_calls()
    assert (call["model"], call["units"]) == (TEXT_MODEL, 0)  # answered, but unusable
    assert_key_nowhere(shipped_cli, result)


def test_missing_key_refuses_before_any_model_step_runs(
    shipped_cli: CliEnv, server: FakeOpenAI
) -> None:
    result, report = materialize(shipped_cli, key=None)

    assert result.exit_code == 1
    assert report["error"]["code"] == "provider.no_key"
    assert KEY_ENV in report["error"]["message"]
    assert server.requests == []
    # story_source calls no model, so it needs no key; every step that would
    # call one is refused before its claim.
    assert {step: row.status for step, row in rows(shipped_cli.ledger).items()} == {
        "story_source": "completed"
    }
    assert shipped_cli.ledger.provider_calls() == []


def test_switching_the_text_model_blocks_only_text_steps(
    shipped_cli: CliEnv, server: FakeOpenAI
) -> None:
    result, _ = materialize(shipped_cli)
    assert result.exit_code == 0, result.output
    path = shipped_cli.home / "projects" / PROJECT / "project.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["provider"]["text_model"] = "gpt-e2e-text-2"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")

    shadow = shipped_cli.json("decide", "--partition", PARTITION, "--all")
    verdicts = {d["step"]: d for d in shadow["decisions"]}

    for step_id in TEXT_STEPS:
        assert verdicts[step_id]["verdict"] == "blocked", (step_id, verdicts[step_id])
        assert "provider.text_model" in verdicts[step_id]["reason"]
    for step_id in set(STEPS) - TEXT_STEPS:
        assert verdicts[step_id]["verdict"] == "skip", (step_id, verdicts[step_id])

    calls_before = len(server.requests)
    again, report = materialize(shipped_cli)
    assert again.exit_code == 1
    assert report["error"]["code"] == "step.resume_blocked"
    assert "provider.text_model" in report["error"]["message"]
    assert len(server.requests) == calls_before  # a block spends nothing
    assert_key_nowhere(shipped_cli, result, again)


def test_a_force_after_an_image_model_switch_draws_with_the_new_model(
    shipped_cli: CliEnv, server: FakeOpenAI
) -> None:
    """The block names the switch; the operator's force then asks for pictures by the new
    model: none drawn by the old one is reused (its receipt names the model)."""
    result, _ = materialize(shipped_cli)
    assert result.exit_code == 0, result.output
    refs = shipped_cli.home / "checkpoints" / PROJECT / EPISODE / "ref_image_gen"
    before = {p.name: p.read_bytes() for p in refs.rglob("*.png") if "archive" not in p.parts}
    assert before
    path = shipped_cli.home / "projects" / PROJECT / "project.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["provider"]["image_model"] = "gpt-e2e-image-2"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")

    shadow = shipped_cli.json("decide", "--partition", PARTITION, "--all")
    verdicts = {d["step"]: d for d in shadow["decisions"]}
    for step_id in IMAGE_STEPS:
        assert verdicts[step_id]["verdict"] == "blocked", (step_id, verdicts[step_id])
        assert "provider.image_model" in verdicts[step_id]["reason"]

    seen = len(server.seen(IMAGES))
    forced = shipped_cli.invoke(
        "force", "--partition", PARTITION, "--step", "ref_image_gen", env={KEY_ENV: API_KEY}
    )
    assert forced.exit_code == 0, forced.output
    drawn = server.seen(IMAGES)[seen:]
    assert len(drawn) == len(before)  # every reference redrawn, by the new model only
    assert {r.body["model"] for r in drawn} == {"gpt-e2e-image-2"}
    receipts = [
        json.loads(p.read_text()) for p in refs.rglob("*.receipt.json") if "archive" not in p.parts
    ]
    assert {r["model"] for r in receipts} == {"gpt-e2e-image-2"}
    assert rows(shipped_cli.ledger)["ref_image_gen"].resolved_model == "gpt-e2e-image-2"
    assert_key_nowhere(shipped_cli, result, forced)


def test_literal_yaml_key_is_used_but_never_copied(shipped_cli: CliEnv, server: FakeOpenAI) -> None:
    path = shipped_cli.home / "projects" / PROJECT / "project.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["provider"]["api_key"] = API_KEY
    path.write_text(yaml.safe_dump(config), encoding="utf-8")

    result, report = materialize(shipped_cli, key=None)

    assert result.exit_code == 0, result.output
    assert report["ok"] is True
    assert {r.headers["authorization"] for r in server.requests} == {f"Bearer {API_KEY}"}
    path.unlink()  # the one file that may hold it: the operator's own
    assert_key_nowhere(shipped_cli, result)
