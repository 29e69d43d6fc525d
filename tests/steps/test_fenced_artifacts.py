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

from cli_helpers import CliEnv, make_env
from test_leases import FAST_LEASE, PARTITION, _row, _run, _storyboard

from pipeline_defs.resume.partition import Episode
from pipeline_defs.storyboard import sample_stories

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
        owner = _row(cli, STEP)["run_id"]
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
    out, err = zombie.communicate(timeout=120)
    assert zombie.returncode != 0
    assert "step.ownership_lost" in out + err, (out + err)[-3000:]
    assert _files(step_dir) == winner  # same bytes, inode and mtime
    assert _archive(step_dir) == archive
    row = _row(cli, STEP)
    assert row["run_id"] == owner and row["status"] == "completed"
    before = len(cli.ledger.provider_calls())
    code, out = _run(cli, "materialize", "--partition", PARTITION, "--step", STEP)
    assert code == 0, out[-2000:]
    assert len(cli.ledger.provider_calls()) == before  # a later resume pays nothing
    assert _files(step_dir) == winner
