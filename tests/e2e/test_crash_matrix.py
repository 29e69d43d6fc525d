"""Crash-point matrix: kill -9 of a real ``storyboard materialize`` at named stages.

Each case runs the real pipeline (offline models) in a child process with
``PIPELINE_CRASH_AT=<step>:<stage>``: the process SIGKILLs itself when that step's run
protocol reaches the stage (no handler, no ``finally``). One resume follows, once the dead
owner's lease has lapsed (a 1 s lease: a row the dead process left ``running`` is then
recovered as a stale lease). Then
ledger, checkpoints and files must agree with a clean run of the same story — every step
completed, every checkpoint's content hash equal to the clean run's, so the review's fixes
are present in ``scene_detail`` and ``entity_t2i`` exactly once — and the provider calls of
both processes together must equal a clean run's: no call is in flight at these kills, and
every reply that came back before one is taken back from the journal of paid replies
(``replied.<k>``: killed after k of a step's n replies, the resume pays the n - k).

Every case runs on both ledgers (``db_url``: SQLite and PostgreSQL, where row locks and
isolation differ) and on both storages (``storage_url``: a local home, and S3 on a real moto
server with the home as scratch), with the same expected decisions and calls; the clean
reference run is made once, on SQLite and a local home (its rows, content hashes and call
counts do not depend on either).

Before the fix, ``t2i_review:published`` (the mutator's row completed, its edits not yet
written) resumed into SKIPs everywhere with un-reviewed prompts and images drawn from them.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import CliEnv, make_env
from s3_server import SECRET, S3Server, running_s3_server

from pipeline_defs.resume.layout import SCRATCH_DIR
from pipeline_defs.resume.partition import Episode
from pipeline_defs.storyboard import STORYBOARD_STEPS, sample_stories
from resources.checkpoints.published import scratch_cache_of
from resources.checkpoints.store import CheckpointStore
from resources.pipeline import PipelineResource

PARTITION = "demo/ep01"
LEASE_SECONDS = 1.0
# Crash point → what the resume does with the killed step: its decision and its provider
# calls. A row left running is a lapsed lease; edits written ahead and pictures already
# staged are applied without a model call; a published step is kept (the review's, whose
# edits are not all written yet, re-runs to write them, still without a call).
CASES: dict[str, tuple[str, int | None]] = {
    # the mutator: before and after its own publish, between and after victim edits (killed
    # once its reply came back, the resume takes that reply back from the journal)
    "t2i_review:executed": ("stale_running_recovery", 0),
    "t2i_review:mutation.pending_written": ("stale_running_recovery", 0),
    "t2i_review:published": ("rerun_self", 0),
    "t2i_review:mutation.victim_written": ("rerun_self", 0),
    "t2i_review:finished": ("skip", 0),
    # a plain step and an image step
    "entity_canon:claimed": ("stale_running_recovery", 1),
    "entity_canon:published": ("skip", 0),
    "ref_image_gen:executed": ("stale_running_recovery", 0),
    "ref_image_gen:published": ("skip", 0),
    # killed after k of its n replies came back: the resume pays the n - k it never got
    # (None: the clean run's calls of the step less k)
    "scene_detail:replied.2": ("stale_running_recovery", None),
    "composite_image_gen:replied.1": ("stale_running_recovery", None),
    "scene_image_pipeline:replied.7": ("stale_running_recovery", None),
}


def _calls_after(crash_at: str, clean: Mapping[str, int]) -> int:
    """The calls a resume pays for the killed step: its case's figure, or for a kill after
    k replies the clean run's calls of the step less the k that came back."""
    step, stage = crash_at.split(":")
    _, calls = CASES[crash_at]
    if calls is not None:
        return calls
    return clean[step] - int(stage.removeprefix("replied."))


def _checkpoints(cli: CliEnv, storage_url: str | None) -> CheckpointStore:
    """The published checkpoints, read as a new process would."""
    if storage_url is None:
        return CheckpointStore(cli.home)
    reader = PipelineResource(
        home=str(cli.root / "reader"), db_url=cli.db_url, storage_url=storage_url
    )
    return reader.checkpoints()


def _storyboard(cli: CliEnv, *args: str, env: Mapping[str, str] | None = None) -> Any:
    script = str(Path(sys.executable).with_name("storyboard"))
    full = {**cli.subprocess_env(), **(env or {})}
    full.pop("STORYBOARD_DEFS", None)  # the shipped code location
    return subprocess.run(
        [script, *args], env=full, capture_output=True, text=True, timeout=600, cwd=cli.root
    )


def _setup(tmp_path: Path, db_url: str | None = None) -> CliEnv:
    cli = make_env(tmp_path, db_url)
    story = sample_stories()["ep01"]
    episode = Episode.parse(PARTITION)
    done = _storyboard(
        cli, "add-episode", "--project", episode.project_id, "--episode", episode.episode_id,
        "--story", str(story),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return cli


def _state(cli: CliEnv, storage_url: str | None = None) -> dict[str, Any]:
    store = _checkpoints(cli, storage_url)
    episode = Episode.parse(PARTITION)
    rows = {r.step_id: r.status for r in cli.ledger.get_many(episodes=[episode]).values()}
    hashes = {}
    for step in STORYBOARD_STEPS:
        checkpoint = store.load(episode.step(step.step_id))
        hashes[step.step_id] = checkpoint.content_hash if checkpoint else None
    calls = Counter(c["step_id"] for c in cli.ledger.provider_calls())
    return {"rows": rows, "hashes": hashes, "calls": calls}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cli = _setup(tmp_path_factory.mktemp("clean"))
    done = _storyboard(cli, "materialize", "--partition", PARTITION, "--json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    state = _state(cli)
    assert set(state["rows"].values()) == {"completed"}
    return state


@pytest.mark.parametrize("crash_at", CASES)
def test_one_resume_after_a_kill_ends_as_a_clean_run(
    crash_at: str,
    clean: dict[str, Any],
    tmp_path: Path,
    db_url: str,
    storage_url: str | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if storage_url is not None:
        monkeypatch.setenv("PIPELINE_STORAGE_URL", storage_url)  # the processes inherit it
    cli = _setup(tmp_path, db_url)
    killed = _storyboard(
        cli, "materialize", "--partition", PARTITION, env={"PIPELINE_CRASH_AT": crash_at}
    )
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    left = _state(cli, storage_url)["rows"]  # what the killed run finished before it died
    time.sleep(LEASE_SECONDS + 0.2)  # the dead owner never renews: its lease lapses
    resumed = _storyboard(
        cli, "materialize", "--partition", PARTITION, "--json",
        env={"PIPELINE_LEASE_SECONDS": str(LEASE_SECONDS), "PIPELINE_HEARTBEAT_SECONDS": "0.2"},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    state = _state(cli, storage_url)
    assert state["rows"] == clean["rows"]
    assert state["hashes"] == clean["hashes"], "checkpoints differ from a clean run"
    step = crash_at.split(":")[0]
    # No call was in flight at any of these kills: the episode costs a clean run exactly,
    # the killed step's replies that came back taken back from the journal of paid replies.
    total, expected = sum(state["calls"].values()), sum(clean["calls"].values())
    assert total == expected, (crash_at, state["calls"], clean["calls"])
    # Nothing left half-done: no write-ahead edit, no staged temp file (a bucket's scratch
    # is each process's own cache: the killed one's stays, and is no state).
    leftovers = [
        p
        for p in cli.home.rglob("*")
        if (p.name.endswith(".tmp") or "pending" in p.parts) and SCRATCH_DIR not in p.parts
    ]
    assert not [p for p in leftovers if p.is_file()], leftovers
    if storage_url is not None:
        cache = scratch_cache_of(_checkpoints(cli, storage_url))
        assert cache is not None
        pending = [meta.key for meta in cache.storage.list("pending")]
        assert pending == [], pending
    # The resume's own report says what it did, step by step, and agrees with the ledger.
    payload = json.loads(resumed.stdout)
    assert (payload["ok"], payload["command"], payload["partition"]) == (
        True,
        "materialize",
        PARTITION,
    )
    reported = {s["step"]: s for s in payload["steps"]}
    assert sorted(reported) == sorted(clean["rows"]), reported
    assert {k: r["status"] for k, r in reported.items()} == state["rows"]
    this_run = Counter(
        c["step_id"]
        for c in cli.ledger.provider_calls()
        if str(c["run_id"]).startswith(f"{payload['run_id']}:")
    )
    assert {k: r["provider_calls"] for k, r in reported.items() if r["provider_calls"]} == dict(
        this_run
    )
    assert payload["provider_calls"] == this_run.total()
    crashed_decision = CASES[crash_at][0]
    crashed_calls = _calls_after(crash_at, clean["calls"])
    for step_id, entry in reported.items():
        if step_id == step:
            want = (crashed_decision, crashed_calls)
        elif left.get(step_id) == "completed":  # finished before the kill: kept as it is
            want = ("skip", 0)
        else:  # never reached by the killed run: its first run, a clean run's calls
            assert step_id not in left, (step_id, left)
            want = ("first_run", clean["calls"][step_id])
        assert (entry["decision"], entry["provider_calls"]) == want, (crash_at, step_id, entry)


@pytest.mark.parametrize("victim", ["scene_detail", "entity_t2i"])
def test_a_rebuilt_victim_gets_the_review_again(
    victim: str, clean: dict[str, Any], tmp_path: Path, db_url: str
) -> None:
    """the victim's checkpoint directory removed after a complete run; one
    resume rebuilds it, re-runs the review for it alone and ends as a clean run, drawing
    no image again."""
    cli = _setup(tmp_path, db_url)
    done = _storyboard(cli, "materialize", "--partition", PARTITION)
    assert done.returncode == 0, done.stderr[-2000:]
    calls_before = len(cli.ledger.provider_calls())
    shutil.rmtree(CheckpointStore(cli.home).step_dir(Episode.parse(PARTITION).step(victim)))
    resumed = _storyboard(cli, "materialize", "--partition", PARTITION, "--json")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    state = _state(cli)
    # Every checkpoint equals a clean run's: the rebuilt victim carries the fixes again, no
    # image step changed, and the review's own record is a clean run's too (its re-run
    # reviewed the rebuilt victim alone and kept its review of the other, which still holds
    # its edits).
    assert state["hashes"] == clean["hashes"]
    assert set(state["rows"].values()) == {"completed"}
    new_calls = cli.ledger.provider_calls()[calls_before:]
    assert {c["step_id"] for c in new_calls} == {victim, "t2i_review"}
    assert not [c for c in new_calls if c["kind"] == "image"]


# ------------------------------------------------------------------------ on object storage
@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with running_s3_server() as server:
        yield server


# On a bucket: every stage of the review (its write-ahead edits and compare-and-sets are
# pointer updates there) and an image step killed with its pictures uploaded, unpublished.
# And steps killed after some of their replies came back, the resume on another machine.
BUCKET_CASES = [c for c in CASES if c.startswith("t2i_review:")] + [
    "ref_image_gen:executed",
    "scene_detail:replied.2",
    "scene_image_pipeline:replied.7",
]


@pytest.mark.parametrize("crash_at", BUCKET_CASES)
def test_one_resume_after_a_kill_on_a_bucket_from_another_machine(
    crash_at: str,
    clean: dict[str, Any],
    tmp_path: Path,
    pg_url: str,
    s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same kills with checkpoints on S3 (moto) and the ledger on PostgreSQL, the
    resume on another machine (an empty home of its own: what the killed process drew and
    never published is out of its reach, so its calls are bounded, not the table's): the
    resumed episode publishes exactly the clean run's checkpoints (same content hashes, the
    review's fixes applied once), within the clean run's calls plus the killed step's own,
    and leaves no write-ahead edit in the bucket."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in s3.env(SECRET).items():
        monkeypatch.setenv(name, value)
    bucket = s3.new_bucket()
    url = f"s3://{bucket}/crash"
    cli = make_env(tmp_path, pg_url)
    monkeypatch.setenv("PIPELINE_STORAGE_URL", url)  # the processes inherit it
    story = sample_stories()["ep01"]
    added = _storyboard(
        cli, "add-episode", "--project", "demo", "--episode", "ep01", "--story", str(story)
    )
    assert added.returncode == 0, added.stderr[-2000:]
    killed = _storyboard(
        cli, "materialize", "--partition", PARTITION, env={"PIPELINE_CRASH_AT": crash_at}
    )
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    time.sleep(LEASE_SECONDS + 0.2)
    resumer = tmp_path / "resumer"  # another machine: an empty home of its own
    resumer.mkdir()
    resumed = _storyboard(
        cli, "materialize", "--partition", PARTITION, "--json",
        env={
            "PIPELINE_HOME": str(resumer),
            "PIPELINE_LEASE_SECONDS": str(LEASE_SECONDS),
            "PIPELINE_HEARTBEAT_SECONDS": "0.2",
        },
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    reader = PipelineResource(home=str(tmp_path / "reader"), db_url=pg_url, storage_url=url)
    episode = Episode.parse(PARTITION)
    rows = {r.step_id: r.status for r in cli.ledger.get_many(episodes=[episode]).values()}
    assert rows == clean["rows"]
    store = reader.checkpoints()
    hashes = {}
    for step in STORYBOARD_STEPS:
        loaded = store.load(episode.step(step.step_id))
        hashes[step.step_id] = loaded.content_hash if loaded else None
    assert hashes == clean["hashes"], "checkpoints differ from a clean run"
    # What the killed process was paid for is in the journal in the bucket, out of no
    # machine's reach: with no call in flight at the kill, the episode costs a clean run.
    calls = Counter(c["step_id"] for c in cli.ledger.provider_calls())
    assert calls == clean["calls"], (crash_at, calls, clean["calls"])
    client = s3.client(SECRET)
    pending = client.list_objects_v2(Bucket=bucket, Prefix="crash/pending/").get("Contents", [])
    assert pending == [], [o["Key"] for o in pending]
    assert not (cli.home / "checkpoints").exists()  # the home was scratch only
