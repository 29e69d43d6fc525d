"""Three processes, one endpoint, one rate limit (docs/DESIGN.md#rate-limit).

Three ``storyboard materialize`` processes, one episode each, share a home and a ledger and
call a local OpenAI-compatible server that enforces 30 requests a minute per model over a
sliding minute, answering 429 with ``Retry-After`` beyond it (tests/support/openai_server.py).
With ``provider.requests_per_minute: 30`` they see at most one 429 in all, every episode
completes, and each made exactly the calls of a clean run (no limit, no other process).
"""

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from cli_helpers import CliEnv, make_env
from openai_server import FakeOpenAI, SlidingLimit, serving

from resources.ledger.store import LedgerStore

KEY_ENV = "SB_RATE_E2E_KEY"
PROJECT = "p1"
EPISODES = ("ep01", "ep02", "ep03")
# A short story: a few calls per episode, so three episodes at 30 a minute take about a minute.
STORY = "Mara the keeper lit the lantern.\nMara watched the storm.\nThe ship found the harbour.\n"
LIMIT = 30


def _storyboard(cli: CliEnv, *args: str) -> "subprocess.Popen[str]":
    script = str(Path(sys.executable).with_name("storyboard"))
    env = {**cli.subprocess_env(), KEY_ENV: "sk-rate-e2e"}
    env.pop("STORYBOARD_DEFS", None)  # the shipped code location
    return subprocess.Popen(
        [script, *args], env=env, cwd=cli.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _project(cli: CliEnv, server: FakeOpenAI, episodes: tuple[str, ...], **limits: int) -> None:
    config = {
        "image": {"width": 128, "height": 96},
        "images": {"ref_min_mentions": 3},
        "provider": {
            "kind": "openai",
            "base_url": server.base_url,
            "text_model": "gpt-rate-text",
            "image_model": "gpt-rate-image",
            "api_key_env": KEY_ENV,
            **limits,
        },
    }
    path = cli.home / "projects" / PROJECT / "project.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    story = cli.root / "story.md"
    story.write_text(STORY, encoding="utf-8")
    for episode in episodes:
        cli.ok("add-episode", "--project", PROJECT, "--episode", episode, "--story", str(story))


def _materialize_all(cli: CliEnv, episodes: tuple[str, ...]) -> list[dict[str, Any]]:
    running = [
        _storyboard(cli, "materialize", "--partition", f"{PROJECT}/{e}", "--json") for e in episodes
    ]
    reports = []
    for process in running:
        out, err = process.communicate(timeout=900)
        assert process.returncode == 0, out[-2000:] + err[-3000:]
        reports.append(json.loads(out))
    return reports


def _calls(db_url: str) -> Counter[tuple[str, str]]:
    return Counter((c["episode_id"], c["step_id"]) for c in LedgerStore(db_url).provider_calls())


def test_three_processes_share_one_limit(tmp_path: Path, db_url: str) -> None:
    # A clean run of the story: no limit, one process.
    with serving(fallback=True) as server:
        (tmp_path / "clean").mkdir()
        clean_cli = make_env(tmp_path / "clean", None)
        _project(clean_cli, server, ("ep01",))
        _materialize_all(clean_cli, ("ep01",))
        clean = {step: n for (_, step), n in _calls(clean_cli.db_url).items()}
    assert sum(clean.values()) >= 4
    with serving(fallback=True) as server:
        server.limit = SlidingLimit(per_window=LIMIT, window=60.0)
        (tmp_path / "limited").mkdir()
        cli = make_env(tmp_path / "limited", db_url)
        _project(cli, server, EPISODES, requests_per_minute=LIMIT)
        started = time.monotonic()
        _materialize_all(cli, EPISODES)
        took = time.monotonic() - started
        refused, admitted = server.limit.refused, len(server.limit.times)
    assert refused <= 1, (refused, admitted, took)
    calls = _calls(cli.db_url)
    for episode in EPISODES:
        assert {s: n for (e, s), n in calls.items() if e == episode} == clean, episode
    rows = LedgerStore(cli.db_url).get_many()
    assert {str(r.status) for r in rows.values()} <= {"completed", "not_applicable"}, rows
    assert admitted == 3 * sum(clean.values())
