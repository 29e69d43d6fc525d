"""Redraw chosen items of an image step, under real Dagster runs.

Tag ``resume/redraw=<id>[,<id>…]`` (or ``all``) on a launch of one image step archives those
items' PNGs and receipts, draws exactly those and leaves every other file as it was (same
inode and mtime). Pictures built from a redrawn one are reported, and redrawn only with
``resume/redraw_dependents=true``. A redraw goes through the claim, so it is serialized
with a force or a resume of the same step (two real ``storyboard`` processes).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from storyboard_support import (
    EPISODE,
    PARTITION,
    STEPS,
    Env,
    cloned,
    step_failure_messages,
)

from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.files import file_sha256
from pipeline_defs.resume.layout import ARCHIVE_DIR
from pipeline_defs.steps.redraw import REDRAW_DEPENDENTS_TAG, REDRAW_TAG, dependents_of

IMAGE_STEPS = ("ref_image_gen", "composite_image_gen", "scene_image_pipeline")


# ----------------------------------------------------------------------------- templates
BACKENDS = ("sqlite", "postgresql")  # ``built`` and ``env`` (tests/conftest.py)


# ----------------------------------------------------------------------------- helpers
def identities(env: Env, step_id: str) -> dict[str, tuple[int, int]]:
    """(inode, mtime_ns) of every file of the step outside its archive."""
    base = env.step_dir(step_id)
    return {
        str(p.relative_to(base)): (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in sorted(base.rglob("*"))
        if p.is_file() and ARCHIVE_DIR not in p.relative_to(base).parts
    }


def expected(env: Env, step_id: str) -> list[str]:
    checkpoint = env.checkpoint(step_id)
    assert checkpoint is not None
    return [str(i) for i in checkpoint.data["expected"]]


def image_path(env: Env, step_id: str, item: str) -> Path:
    checkpoint = env.checkpoint(step_id)
    assert checkpoint is not None
    relative: str = checkpoint.data["images"][item]["path"]
    return env.step_dir(step_id) / relative


def archived(env: Env, step_id: str) -> dict[str, bytes]:
    folder = env.step_dir(step_id) / ARCHIVE_DIR
    if not folder.is_dir():
        return {}
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def materialization_metadata(result: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        out[materialization.asset_key.path[-1]] = {
            k: getattr(v, "value", v) for k, v in materialization.metadata.items()
        }
    return out


def assert_clean(env: Env, step_id: str) -> None:
    decision = env.judge(step_id)
    assert decision.action is ResumeAction.SKIP, decision


# ----------------------------------------------------------------------------- scenarios
@pytest.mark.parametrize("step_id", IMAGE_STEPS)
def test_a_redraw_draws_exactly_that_item_and_touches_nothing_else(env: Env, step_id: str) -> None:
    item = expected(env, step_id)[0]
    target = image_path(env, step_id, item)
    old = target.read_bytes()
    old_receipt = (target.parent / f"{target.name}.receipt.json").read_bytes()
    before = identities(env, step_id)
    others = {
        k: v
        for k, v in before.items()
        if not k.startswith(target.relative_to(env.step_dir(step_id)).as_posix())
    }
    others.pop("checkpoint.json")

    outcome = env.materialize([step_id], tags={REDRAW_TAG: item})

    assert outcome.decisions == {step_id: ResumeAction.REDRAW_EXPLICIT.value}
    assert outcome.calls_of(step_id, "image") == 1 and outcome.total_calls == 1
    assert target.read_bytes() != old
    after = identities(env, step_id)
    assert {k: after[k] for k in others} == others  # same inode and mtime
    kept = archived(env, step_id)
    assert old in kept.values() and old_receipt in kept.values()
    checkpoint = env.checkpoint(step_id)
    assert checkpoint is not None
    assert checkpoint.data["images"][item]["sha256"] == file_sha256(target)
    row = env.row(step_id)
    assert row is not None and row.status == "completed"
    metadata = materialization_metadata(outcome.result)[step_id]
    assert metadata["step/redrawn"] == 1
    assert_clean(env, step_id)
    # a later resume keeps the new picture and pays nothing
    again = env.materialize([step_id])
    assert again.total_calls == 0 and target.read_bytes() != old


@pytest.mark.parametrize("step_id", IMAGE_STEPS)
def test_on_a_bucket_a_redraw_draws_exactly_that_item_and_keeps_every_other_object(
    s3_built: Env, step_id: str
) -> None:
    """The same redraw with the checkpoints on S3: one call; the item is a new object, and
    the new manifest names every other picture by the very object the old one named (kept
    copy-free: nothing else uploaded, nothing overwritten)."""
    with cloned(s3_built) as env:
        item = expected(env, step_id)[0]
        checkpoint, before = env.checkpoint(step_id), env.manifest(step_id)
        assert checkpoint is not None and before is not None
        path = checkpoint.data["images"][item]["path"]
        old = env.read_artifact(step_id, path)

        outcome = env.materialize([step_id], tags={REDRAW_TAG: item})

        assert outcome.decisions == {step_id: ResumeAction.REDRAW_EXPLICIT.value}
        assert outcome.calls_of(step_id, "image") == 1 and outcome.total_calls == 1
        after = env.manifest(step_id)
        assert after is not None and env.read_artifact(step_id, path) != old
        assert after.artifacts[path].key != before.artifacts[path].key
        others = {k: v for k, v in before.artifacts.items() if k != path}
        assert {k: v for k, v in after.artifacts.items() if k != path} == others
        row = env.row(step_id)
        assert row is not None and row.status == "completed"
        assert_clean(env, step_id)
        again = env.materialize([step_id])  # a later resume keeps it and pays nothing
        assert again.total_calls == 0


def test_redraw_all_draws_every_item(sqlite_env: Env) -> None:
    env, step_id = sqlite_env, "composite_image_gen"
    items = expected(env, step_id)
    old = {i: image_path(env, step_id, i).read_bytes() for i in items}
    outcome = env.materialize([step_id], tags={REDRAW_TAG: "all"})
    assert outcome.calls_of(step_id, "image") == len(items) > 1
    assert all(image_path(env, step_id, i).read_bytes() != old[i] for i in items)
    assert set(old.values()) <= set(archived(env, step_id).values())
    assert_clean(env, step_id)


def test_an_unknown_item_fails_typed_before_any_call_and_changes_nothing(env: Env) -> None:
    step_id = "ref_image_gen"
    item = expected(env, step_id)[0]
    snapshot, row = env.snapshot(), env.row(step_id)
    outcome = env.materialize([step_id], tags={REDRAW_TAG: f"{item},C99"}, raise_on_error=False)
    assert not outcome.result.success
    (message,) = step_failure_messages(outcome.result).values()
    assert "redraw.unknown_item" in message and "C99" in message, message
    assert outcome.total_calls == 0
    assert env.snapshot() == snapshot and env.row(step_id) == row
    assert not archived(env, step_id)
    # with dependents asked for, an id no upstream step lists is just as unknown
    outcome = env.materialize(
        ["composite_image_gen"],
        tags={REDRAW_TAG: "C99", REDRAW_DEPENDENTS_TAG: "true"},
        raise_on_error=False,
    )
    (message,) = step_failure_messages(outcome.result).values()
    assert "redraw.unknown_item" in message, message
    assert outcome.total_calls == 0 and env.snapshot() == snapshot


def test_a_redraw_of_a_step_without_items_is_refused(sqlite_env: Env) -> None:
    snapshot = sqlite_env.snapshot()
    outcome = sqlite_env.materialize(
        ["world_guide"], tags={REDRAW_TAG: "all"}, raise_on_error=False
    )
    (message,) = step_failure_messages(outcome.result).values()
    assert "redraw.unsupported" in message, message
    assert outcome.total_calls == 0 and sqlite_env.snapshot() == snapshot


def test_dependents_are_reported_and_redrawn_only_when_asked(env: Env) -> None:
    ref = expected(env, "ref_image_gen")[0]
    load = env.checkpoint
    found = dependents_of(STEPS.values(), load, "ref_image_gen", [ref])
    composites = found.get("composite_image_gen", [])
    shots = found.get("scene_image_pipeline", [])
    assert composites and shots, found
    downstream = ("composite_image_gen", "scene_image_pipeline")
    before = {s: identities(env, s) for s in downstream}

    # without the flag: reported (run metadata and decide), nothing downstream touched
    outcome = env.materialize(["ref_image_gen"], tags={REDRAW_TAG: ref})
    metadata = materialization_metadata(outcome.result)["ref_image_gen"]
    assert composites[0] in metadata["step/redraw_dependents"]
    assert shots[0] in metadata["step/redraw_dependents"]
    assert {s: identities(env, s) for s in downstream} == before
    from pipeline_defs.steps.redraw import outdated_items

    outdated = outdated_items(STEPS.values(), env.checkpoints.load, EPISODE)
    assert sorted(outdated.get("composite_image_gen", {})) == sorted(composites)
    # the sensor does not redraw them silently either
    assert env.judge("composite_image_gen").action is ResumeAction.SKIP
    # nor does any other run of those steps: an unrelated redraw draws exactly its item,
    # a resume draws exactly the lost shot (none is blocked for the redrawn reference)
    other = next(i for i in expected(env, "composite_image_gen") if i not in composites)
    outcome = env.materialize(["composite_image_gen"], tags={REDRAW_TAG: other})
    assert outcome.total_calls == 1
    lost = shots[0]
    image_path(env, "scene_image_pipeline", lost).unlink()
    outcome = env.materialize(["scene_image_pipeline"])
    row = env.row("scene_image_pipeline")
    assert outcome.total_calls == 1 and row is not None and row.status == "completed"
    outdated = outdated_items(STEPS.values(), env.checkpoints.load, EPISODE)
    assert sorted(outdated.get("composite_image_gen", {})) == sorted(composites)
    before = {s: identities(env, s) for s in downstream}

    # with the flag, in one run of the image steps: exactly the dependents are drawn
    outcome = env.materialize(
        ["composite_image_gen", "scene_image_pipeline"],
        tags={REDRAW_TAG: ref, REDRAW_DEPENDENTS_TAG: "true"},
    )
    assert outcome.calls_of("composite_image_gen", "image") == len(composites)
    # the shots built from the unrelated redrawn composite are outdated too, and follow
    also = dependents_of(STEPS.values(), load, "composite_image_gen", [other])
    follow = set(shots) | set(also.get("scene_image_pipeline", []))
    assert outcome.calls_of("scene_image_pipeline", "image") == len(follow)
    assert outdated_items(STEPS.values(), env.checkpoints.load, EPISODE) == {}
    after = identities(env, "composite_image_gen")
    untouched = [k for k in before["composite_image_gen"] if not any(c in k for c in composites)]
    untouched.remove("checkpoint.json")
    assert {k: after[k] for k in untouched} == {
        k: before["composite_image_gen"][k] for k in untouched
    }
    for step_id in IMAGE_STEPS:
        assert_clean(env, step_id)


# ----------------------------------------------------------------------------- CLI and race
def _cli_env(env: Env, dagster_home: Path, latency_ms: int = 0) -> dict[str, str]:
    """A ``storyboard`` process on this home, its partition registered in DAGSTER_HOME."""
    instance = dg.DagsterInstance.from_config(str(dagster_home))
    try:
        if not instance.has_dynamic_partition("episodes", PARTITION):
            instance.add_dynamic_partitions("episodes", [PARTITION])
    finally:
        instance.dispose()
    out = {
        **os.environ,
        "PIPELINE_HOME": str(env.home),
        "DAGSTER_HOME": str(dagster_home),
        "PIPELINE_DB_URL": env.db_url,
        "PIPELINE_OFFLINE_LATENCY_MS": str(latency_ms),
    }
    out.pop("STORYBOARD_DEFS", None)
    return out


def _storyboard(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    exe = str(Path(sys.executable).with_name("storyboard"))
    return subprocess.Popen(
        [exe, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: frozen and resumed as one
    )


def test_cli_redraw_with_json(sqlite_env: Env, tmp_path: Path) -> None:
    env = sqlite_env
    item = expected(env, "composite_image_gen")[-1]
    old = image_path(env, "composite_image_gen", item).read_bytes()
    proc = _storyboard(
        "redraw", "--partition", PARTITION, "--step", "composite_image_gen",
        "--item", item, "--json", env=_cli_env(env, tmp_path),
    )  # fmt: skip
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-2000:] + err[-2000:]
    report = json.loads(out)
    assert report["provider_calls"] == 1 and report["redraw"]["items"] == [item]
    assert image_path(env, "composite_image_gen", item).read_bytes() != old
    unknown = _storyboard(
        "redraw", "--partition", PARTITION, "--step", "composite_image_gen",
        "--item", "NOPE", "--json", env=_cli_env(env, tmp_path),
    )  # fmt: skip
    out, err = unknown.communicate(timeout=300)
    assert unknown.returncode != 0 and "redraw.unknown_item" in out + err


def _holding(env: Env, proc: subprocess.Popen[str], step_id: str, previous: Any) -> str:
    """Wait until ``proc`` holds the step: its claim on the row and a provider call of its
    in flight (sent, not answered: it sleeps in the simulated latency, no transaction
    open). Returns its owner token."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        row = env.row(step_id)
        if row is not None and row.status == "running" and row.run_id != previous:
            calls = env.ledger.provider_calls(env.key(step_id), run_id=row.run_id)
            if any(c["finished_at"] is None for c in calls):
                return str(row.run_id)
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the first process ended before holding the step: {out}{err}")
        time.sleep(0.05)
    raise AssertionError("the first process never held the step")


@pytest.mark.parametrize(("holder", "rival"), [("force", "redraw"), ("redraw", "materialize")])
def test_a_redraw_racing_a_force_or_resume_is_serialized(
    env: Env, tmp_path: Path, holder: str, rival: str
) -> None:
    """Two real processes on one step, proven to overlap: the second starts only once the
    first holds the claim with a model call in flight, and the first is frozen (SIGSTOP)
    until the second has finished. The second is refused (``step.already_running``, naming
    the holder); afterwards it runs, and neither undoes the other."""
    step_id = "composite_image_gen"
    items = expected(env, step_id)
    item = items[0]
    old = {i: image_path(env, step_id, i).read_bytes() for i in items}
    # A force or a resume has work (one lost picture: one call), so each command holds the
    # claim through a provider call.
    image_path(env, step_id, items[-1]).unlink()
    args = {
        "redraw": ("redraw", "--partition", PARTITION, "--step", step_id, "--item", item),
        "force": ("force", "--partition", PARTITION, "--step", step_id),
        "materialize": ("materialize", "--partition", PARTITION, "--step", step_id),
    }
    # A long lease: the frozen holder renews nothing, and must stay a live owner meanwhile.
    lease = {"PIPELINE_LEASE_SECONDS": "600"}
    slow = {**_cli_env(env, tmp_path, latency_ms=2000), **lease}
    fast = {**_cli_env(env, tmp_path), **lease}
    before = env.row(step_id)
    previous = before.run_id if before is not None else None

    first = _storyboard(*args[holder], env=slow)
    try:
        owner = _holding(env, first, step_id, previous)
        os.killpg(first.pid, signal.SIGSTOP)  # frozen mid-call, holding the claim
        try:
            second = _storyboard(*args[rival], env=fast)
            out, err = second.communicate(timeout=600)
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        first_out, first_err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, first_out[-2000:] + first_err[-2000:]
    assert second.returncode != 0, out[-2000:] + err[-2000:]
    assert "step.already_running" in out + err, out + err
    assert owner.split(":")[0] in out + err, (owner, out + err)  # refused by that owner
    if holder == "redraw":
        assert image_path(env, step_id, item).read_bytes() != old[item]
        assert old[item] in archived(env, step_id).values()

    # The refused one runs now; neither undoes the other.
    again = _storyboard(*args[rival], env=fast)
    again_out, again_err = again.communicate(timeout=600)
    assert again.returncode == 0, again_out[-2000:] + again_err[-2000:]
    checkpoint = env.checkpoint(step_id)
    assert checkpoint is not None and sorted(checkpoint.data["images"]) == sorted(items)
    assert image_path(env, step_id, item).read_bytes() != old[item]  # the redraw stays
    assert old[item] in archived(env, step_id).values()
    for i in items[1:-1]:
        assert image_path(env, step_id, i).read_bytes() == old[i]
    assert_clean(env, step_id)
