"""Every file a run writes is fenced, not only checkpoint.json.

An image worker paused (SIGSTOP) during a provider call loses its lease; another owner
takes the row over, draws and publishes. Resumed, the old worker must neither replace
nor archive away a file the new owner published: the winner's PNGs and receipts keep
their bytes, inode and mtime, the archive gains nothing, and a later resume pays nothing.
"""

import os
import signal
import time
from pathlib import Path
from typing import Any

from cli_helpers import CliEnv, make_env
from s3_server import SECRET, running_s3_server
from test_leases import FAST_LEASE, PARTITION, _row, _run, _storyboard

from pipeline_defs.resume.partition import Episode
from pipeline_defs.storyboard import sample_stories
from resources.checkpoints.manifest import Manifest

STEP = "ref_image_gen"


def _files(step_dir: Path) -> dict[str, tuple[bytes, int, int]]:
    """Published files of the step (bytes, inode, mtime_ns), archive and staging excluded."""
    out = {}
    for path in sorted(step_dir.rglob("*")):
        parts = path.relative_to(step_dir).parts
        if path.is_file() and parts[0] not in ("archive", ".staging"):
            out[str(path.relative_to(step_dir))] = (
                path.read_bytes(),
                path.stat().st_ino,
                path.stat().st_mtime_ns,
            )
    return out


def _archive(step_dir: Path) -> list[str]:
    folder = step_dir / "archive"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_a_paused_image_worker_cannot_touch_the_files_the_new_owner_published(
    tmp_path: Path,
) -> None:
    cli: CliEnv = make_env(tmp_path)
    episode = Episode.parse(PARTITION)
    code, out = _run(
        cli, "add-episode", "--project", episode.project_id, "--episode", episode.episode_id,
        "--story", str(sample_stories()["ep01"]),
    )  # fmt: skip
    assert code == 0, out[-2000:]
    code, out = _run(cli, "materialize", "--partition", PARTITION)
    assert code == 0, out[-2000:]
    step_dir = cli.home / "checkpoints" / "demo" / "ep01" / STEP
    # Every reference PNG lost: the next run of the step draws them all again.
    for png in step_dir.glob("refs/*.png"):
        png.unlink()
    slow = {**FAST_LEASE, "PIPELINE_OFFLINE_LATENCY_MS": "1500"}
    zombie = _storyboard(cli, "materialize", "--partition", PARTITION, "--step", STEP, env=slow)
    deadline = time.monotonic() + 120
    while not [
        c for c in cli.ledger.provider_calls() if c["step_id"] == STEP and c["finished_at"] is None
    ]:  # paused in the middle of a call: it will write as soon as it wakes up
        assert time.monotonic() < deadline and zombie.poll() is None, zombie.communicate()
        time.sleep(0.02)
    os.kill(zombie.pid, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # two leases
        fast = {**FAST_LEASE, "PIPELINE_OFFLINE_LATENCY_MS": "0"}
        code, out = _run(cli, "materialize", "--partition", PARTITION, "--step", STEP, env=fast)
        assert code == 0, out[-3000:]
        assert "stale_running_recovery" in out, out[-3000:]
        winner = _files(step_dir)
        archive = _archive(step_dir)
        owner = _row(cli, STEP).run_id
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    out, err = zombie.communicate(timeout=120)
    assert zombie.returncode != 0
    assert "step.ownership_lost" in out + err, (out + err)[-3000:]
    assert _files(step_dir) == winner  # same bytes, inode and mtime
    assert _archive(step_dir) == archive
    row = _row(cli, STEP)
    assert row.run_id == owner and row.status == "completed"
    before = len(cli.ledger.provider_calls())
    code, out = _run(cli, "materialize", "--partition", PARTITION, "--step", STEP)
    assert code == 0, out[-2000:]
    assert len(cli.ledger.provider_calls()) == before  # a later resume pays nothing
    assert _files(step_dir) == winner


def _objects(client: Any, bucket: str, prefix: str) -> dict[str, tuple[bytes, str]]:
    """Every object below ``prefix``: (bytes, e_tag)."""
    out: dict[str, tuple[bytes, str]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            out[item["Key"]] = (body, item["ETag"])
    return out


def test_on_s3_a_paused_image_worker_cannot_touch_the_winners_objects_or_pointer(
    tmp_path: Path,
) -> None:
    """The same race with checkpoints on a bucket: the loser wrote only into scratch of its
    own (its fenced write is refused before any upload), the winner's pointer and every
    object it names keep their bytes and e_tags."""
    with running_s3_server() as server:
        bucket = server.new_bucket()
        client = server.client(SECRET)
        url = f"s3://{bucket}/sb"
        cli: CliEnv = make_env(tmp_path)
        s3 = {**server.env(SECRET), "PIPELINE_STORAGE_URL": url}
        episode = Episode.parse(PARTITION)
        code, out = _run(
            cli, "add-episode", "--project", episode.project_id, "--episode",
            episode.episode_id, "--story", str(sample_stories()["ep01"]), env=s3,
        )  # fmt: skip
        assert code == 0, out[-2000:]
        code, out = _run(cli, "materialize", "--partition", PARTITION, env=s3)
        assert code == 0, out[-2000:]
        assert not (cli.home / "checkpoints").exists()  # published to the bucket only
        first_pointer = _row(cli, STEP).checkpoint_pointer
        assert first_pointer is not None  # a bucket's row names its manifest
        first = Manifest.decode(first_pointer)
        for ref in first.artifacts.values():  # every picture lost: all drawn again
            client.delete_object(Bucket=bucket, Key=f"sb/{ref.key}")
        slow = {**s3, **FAST_LEASE, "PIPELINE_OFFLINE_LATENCY_MS": "1500"}
        zombie = _storyboard(cli, "materialize", "--partition", PARTITION, "--step", STEP, env=slow)
        deadline = time.monotonic() + 120
        while not [
            c
            for c in cli.ledger.provider_calls()
            if c["step_id"] == STEP and c["finished_at"] is None
        ]:
            assert time.monotonic() < deadline and zombie.poll() is None, zombie.communicate()
            time.sleep(0.02)
        os.kill(zombie.pid, signal.SIGSTOP)
        try:
            time.sleep(1.0)  # two leases
            fast = {**s3, **FAST_LEASE, "PIPELINE_OFFLINE_LATENCY_MS": "0"}
            code, out = _run(cli, "materialize", "--partition", PARTITION, "--step", STEP, env=fast)
            assert code == 0, out[-3000:]
            assert "stale_running_recovery" in out, out[-3000:]
            row = _row(cli, STEP)
            pointer, owner = row.checkpoint_pointer, row.run_id
            winner = _objects(client, bucket, f"sb/checkpoints/demo/ep01/{STEP}/")
        finally:
            os.kill(zombie.pid, signal.SIGCONT)
        out, err = zombie.communicate(timeout=120)
        assert zombie.returncode != 0
        assert "step.ownership_lost" in out + err, (out + err)[-3000:]
        row = _row(cli, STEP)
        assert (row.checkpoint_pointer, row.run_id) == (pointer, owner)
        assert _objects(client, bucket, f"sb/checkpoints/demo/ep01/{STEP}/") == winner
        assert pointer is not None
        published = Manifest.decode(pointer)
        assert all(f"sb/{ref.key}" in winner for ref in published.artifacts.values())
        before = len(cli.ledger.provider_calls())
        code, out = _run(cli, "materialize", "--partition", PARTITION, "--step", STEP, env=s3)
        assert code == 0, out[-2000:]
        assert len(cli.ledger.provider_calls()) == before  # a later resume pays nothing


def test_a_paused_text_worker_past_its_lease_spends_nothing_more_and_publishes_nothing(
    tmp_path: Path,
) -> None:
    """A text step (one call per scene) paused (SIGSTOP) in its first call past its lease:
    another owner takes the row over and publishes. Resumed, the old worker makes no further
    provider call (``Lease.check`` before every call: the call in flight is all it spends)
    and publishes nothing (the winner's envelope keeps its bytes and inode)."""
    step = "scene_detail"
    cli: CliEnv = make_env(tmp_path)
    episode = Episode.parse(PARTITION)
    code, out = _run(
        cli, "add-episode", "--project", episode.project_id, "--episode", episode.episode_id,
        "--story", str(sample_stories()["ep01"]),
    )  # fmt: skip
    assert code == 0, out[-2000:]
    code, out = _run(cli, "materialize", "--partition", PARTITION)
    assert code == 0, out[-2000:]
    step_dir = cli.home / "checkpoints" / "demo" / "ep01" / step
    scenes = len([c for c in cli.ledger.provider_calls() if c["step_id"] == step])
    assert scenes >= 3, "the test needs a step of several calls"
    (step_dir / "checkpoint.json").unlink()  # lost: the next run of the step calls again
    slow = {**FAST_LEASE, "PIPELINE_OFFLINE_LATENCY_MS": "1500"}
    zombie = _storyboard(cli, "materialize", "--partition", PARTITION, "--step", step, env=slow)
    deadline = time.monotonic() + 120
    while not (
        in_flight := [
            c
            for c in cli.ledger.provider_calls()
            if c["step_id"] == step and c["finished_at"] is None
        ]
    ):
        assert time.monotonic() < deadline and zombie.poll() is None, zombie.communicate()
        time.sleep(0.02)
    zombie_run = in_flight[0]["run_id"]
    os.kill(zombie.pid, signal.SIGSTOP)
    try:
        time.sleep(1.0)  # two leases
        fast = {**FAST_LEASE, "PIPELINE_OFFLINE_LATENCY_MS": "0"}
        code, out = _run(cli, "materialize", "--partition", PARTITION, "--step", step, env=fast)
        assert code == 0, out[-3000:]
        assert "stale_running_recovery" in out, out[-3000:]
        winner = _files(step_dir)
        owner = _row(cli, step).run_id
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    out, err = zombie.communicate(timeout=120)
    assert zombie.returncode != 0
    assert "step.ownership_lost" in out + err, (out + err)[-3000:]
    spent = [c for c in cli.ledger.provider_calls() if c["run_id"] == zombie_run]
    assert len(spent) == 1, f"the fenced worker called again after its lease was lost: {spent}"
    assert _files(step_dir) == winner  # nothing published over the winner
    row = _row(cli, step)
    assert row.run_id == owner and row.status == "completed"
