"""No paid call on a retry that cannot succeed.

Driven the way it happens to an operator, with the real ``storyboard`` CLI on the shipped
pipeline: a directory (or a FIFO) planted where a reference image should be; a real SIGKILL
of the editorial review at a named crash point; a step killed again and again until its
automatic recoveries are exhausted.
"""

import json
import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_helpers import CliEnv, make_env
from cli_homes import (
    EPISODE,
    PARTITION,
    build,
    calls,
    clone,
    decision_of,
    destroy,
    register,
    row,
    sensor_run,
    shipped,
    status_by_step,
    step_dir,
    storyboard,
)

from pipeline_defs.cli import commands_in
from pipeline_defs.steps.faults import CRASH_ENV
from pipeline_defs.storyboard import STORYBOARD_STEPS
from resources.checkpoints.store import CheckpointStore

# ----------------------------------------------------------------------------- homes


@pytest.fixture(scope="module")
def sqlite_cli_built(tmp_path_factory: pytest.TempPathFactory) -> CliEnv:
    return build(tmp_path_factory.mktemp("built-sqlite"))


@pytest.fixture(scope="module")
def postgresql_cli_built(
    tmp_path_factory: pytest.TempPathFactory, pg_server_url: str
) -> Iterator[CliEnv]:
    from storyboard_support import create_pg_database

    url = create_pg_database(pg_server_url)
    cli = build(tmp_path_factory.mktemp("built-pg"), url)
    yield cli
    destroy(cli, pg_server_url)


@pytest.fixture(params=["sqlite", "postgresql"])
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CliEnv]:
    """A copy of a finished episode, on each ledger."""
    template: CliEnv = request.getfixturevalue(f"{request.param}_cli_built")
    server = request.getfixturevalue("pg_server_url") if request.param == "postgresql" else None
    cli = clone(template, tmp_path / "copy", server)
    yield cli
    destroy(cli, server)


# ----------------------------------------------------------------------------- (a)
def _plant(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "directory":
        path.mkdir()
        (path / "left.txt").write_text("whatever an operator left here\n")
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_no_regular_file_where_a_reference_should_be_blocks_before_any_call(
    home: CliEnv, kind: str
) -> None:
    """Before: ``decide`` said "missing", every materialize and force drew C01 (one paid
    call each) and then failed with ``[internal] IsADirectoryError`` at the move (a FIFO
    was silently replaced, after the call)."""
    png = step_dir(home, "ref_image_gen") / "refs" / "C01.png"
    _plant(png, kind)
    before = calls(home)

    decided = decision_of(home, "ref_image_gen")
    assert (decided["action"], decided["code"], decided["origin"]) == (
        "block",
        "step.resume_blocked",
        "contract_drift",
    ), decided
    assert str(png) in decided["reason"] and "not a regular file" in decided["reason"]

    for command in (
        ("materialize", "--partition", PARTITION),
        ("force", "--partition", PARTITION, "--step", "ref_image_gen"),
    ):
        result = home.invoke(*command, "--json")
        assert result.exit_code != 0, result.output
        payload = json.loads(result.stdout)
        assert payload["error"]["code"] == "step.resume_blocked", payload
        assert str(png) in payload["error"]["message"]
        assert calls(home) == before, command  # no paid call
        assert not payload.get("invalidated"), payload  # a blocked force changed nothing
    # left in place, for the operator to look at
    assert png.is_dir() if kind == "directory" else png.is_fifo()
    statuses = status_by_step(home)
    assert statuses["ref_image_gen"] == statuses["composite_image_gen"] == "completed"


def test_once_the_directory_is_moved_away_one_call_redraws_it(home: CliEnv) -> None:
    png = step_dir(home, "ref_image_gen") / "refs" / "C01.png"
    _plant(png, "directory")
    assert home.invoke("materialize", "--partition", PARTITION).exit_code != 0
    png.rename(png.with_name("moved-away"))
    before = calls(home)
    home.ok("materialize", "--partition", PARTITION)
    assert calls(home) - before == {"ref_image_gen": 1}
    assert png.is_file()
    assert decision_of(home, "ref_image_gen")["action"] == "skip"


def test_a_directory_where_a_receipt_goes_fails_every_run_before_any_call(home: CliEnv) -> None:
    """With no checkpoint listing the picture (here: removed), the judge cannot know where
    the files go; the step checks its whole plan before its first call. Before: C01 was
    drawn again by every run, each failing at the move of its receipt."""
    folder = step_dir(home, "ref_image_gen")
    (folder / "checkpoint.json").unlink()
    (folder / "refs" / "C01.png").unlink()
    receipt = folder / "refs" / "C01.png.receipt.json"
    receipt.unlink()
    receipt.mkdir()
    before = calls(home)
    for _attempt in range(2):  # the first fails the row; the retry of a failed row too
        result = home.invoke("materialize", "--partition", PARTITION, "--json")
        assert result.exit_code != 0, result.output
        payload = json.loads(result.stdout)
        assert payload["error"]["code"] == "io.integrity_violation", payload
        assert str(receipt) in payload["error"]["message"]
        assert calls(home) == before
    assert receipt.is_dir()


# ----------------------------------------------------------------------------- (b)
LEASE = {"PIPELINE_LEASE_SECONDS": "1", "PIPELINE_HEARTBEAT_SECONDS": "0.2"}


def _fresh(tmp_path: Path, db_url: str) -> CliEnv:
    cli = shipped(make_env(tmp_path, db_url))
    register(cli)
    return cli


def _hashes(cli: CliEnv) -> dict[str, str | None]:
    store = CheckpointStore(cli.home)
    out = {}
    for step in STORYBOARD_STEPS:
        found = store.load(EPISODE.step(step.step_id))
        out[step.step_id] = found.content_hash if found else None
    return out


def test_a_review_killed_after_writing_ahead_resumes_with_no_call(
    tmp_path: Path, db_url: str, sqlite_cli_built: CliEnv
) -> None:
    """Before: the resume reviewed again (one text call) although every edit was written
    ahead; the README promises no call. Now the written-ahead result is published and
    settled, and the episode ends byte-identical to a clean run."""
    cli = _fresh(tmp_path, db_url)
    killed = storyboard(
        cli,
        "materialize",
        "--partition",
        PARTITION,
        env={CRASH_ENV: "t2i_review:mutation.pending_written"},
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    pending = step_dir(cli, "t2i_review") / "pending"
    written = {p.name for p in pending.iterdir()}
    assert {"entity_t2i.json", "scene_detail.json"} <= written  # the edits, written ahead
    assert status_by_step(cli)["t2i_review"] == "running"
    before = calls(cli)
    time.sleep(1.2)  # the dead owner's 1 s lease lapses
    resumed = storyboard(cli, "materialize", "--partition", PARTITION, "--json", env=LEASE)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    new = calls(cli) - before
    assert new["t2i_review"] == 0, new  # no review again
    assert set(new) <= {"ref_image_gen", "composite_image_gen", "scene_image_pipeline"}
    assert set(status_by_step(cli).values()) == {"completed"}
    assert _hashes(cli) == _hashes(sqlite_cli_built)  # the review's fixes, exactly once
    assert not pending.exists() or not [p for p in pending.iterdir() if p.is_file()]


# ----------------------------------------------------------------------------- (c)
KILL_SHOTS = {CRASH_ENV: "scene_image_pipeline:executed", **LEASE}


def _lose_a_shot(cli: CliEnv) -> None:
    """A lost picture: scene_image_pipeline has one item to draw again."""
    (step_dir(cli, "scene_image_pipeline") / "shots" / "S1_L0_V0.png").unlink()


def test_an_operators_own_killed_runs_do_not_exhaust_the_step(home: CliEnv) -> None:
    """Before: three operator runs killed in a row counted as three automatic recoveries,
    and the operator's next ``materialize`` was refused (``step.recovery_exhausted``)."""
    _lose_a_shot(home)
    for _kill in range(3):
        killed = storyboard(home, "materialize", "--partition", PARTITION, env=KILL_SHOTS)
        assert killed.returncode == -9, killed.stderr[-2000:]
        assert row(home, "scene_image_pipeline").status == "running"
        time.sleep(1.2)  # the dead owner's 1 s lease lapses
    assert row(home, "scene_image_pipeline").recovery_count == 0  # none was automatic

    done = storyboard(home, "materialize", "--partition", PARTITION, "--json", env=LEASE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert row(home, "scene_image_pipeline").status == "completed"


def test_exhausted_automatic_recoveries_print_the_way_out(
    home: CliEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three automatic recoveries killed: the sensor stops, ``decide`` and the operator's
    refused ``materialize`` print the exact commands that get past it (before: none), and
    running them takes the step over and rebuilds it."""
    for name, value in LEASE.items():  # the in-process commands see the short lease too
        monkeypatch.setenv(name, value)
    step = "scene_image_pipeline"
    _lose_a_shot(home)
    for attempt in range(1, 4):
        killed = sensor_run(home, step, env=KILL_SHOTS)
        assert killed.returncode == -9, killed.stderr[-2000:]
        taken = row(home, step)
        assert (taken.status, taken.recovery_count) == ("running", attempt)
        assert taken.last_recovery_reason
        time.sleep(1.2)
    held = row(home, step)
    reset = (
        f"storyboard reset-running --partition {PARTITION} --step {step} "
        f"--expected-started-at {held.started_at!r}"
    )
    force = f"storyboard force --partition {PARTITION} --step {step}"

    decided = decision_of(home, step)
    assert (decided["action"], decided["code"]) == ("block", "step.recovery_exhausted")
    assert commands_in(decided["what_to_do"]) == [reset, force]

    refused = home.invoke("materialize", "--partition", PARTITION, "--json")
    assert refused.exit_code != 0
    error = json.loads(refused.stdout)["error"]
    assert error["code"] == "step.recovery_exhausted", error
    assert commands_in(error["message"]) == [reset, force]
    assert row(home, step).status == "running"  # a refusal changes nothing

    home.ok(*shlex.split(reset)[1:])
    released = row(home, step)
    assert released.status == "failed"
    # the takeover keeps what the automatic recoveries recorded
    assert (released.recovery_count, released.last_recovery_reason) == (
        held.recovery_count,
        held.last_recovery_reason,
    )
    home.ok(*shlex.split(force)[1:])
    assert row(home, step).status == "completed"
    assert decision_of(home, step)["action"] == "skip"
