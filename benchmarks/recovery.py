"""Benchmark: recovery of a killed step under a real ``dagster dev``.

Two scenarios, each on a fresh home with the shipped code location (``workspace.yaml``:
the real storyboard steps, offline models with a simulated latency per call, the resume
sensor at its shipped 30 s interval) and a Dagster instance like ``deploy/dagster.yaml``
(queued run coordinator, run monitoring on; SQLite storage):

A. **kill**: the sensor launches ``entity_canon`` (one text call of ``--latency`` seconds);
   mid-call, the step's worker process (the ``host/pid`` its ledger row names) is killed
   with SIGKILL. Measured: seconds from the kill to the takeover (a new owner claims the
   row: a STALE_RUNNING_RECOVERY launched by the sensor once the heartbeat is older than the
   lease) and to ``completed`` again, plus the provider calls recorded for the step. The
   bound: one lease + one sensor interval + a run start; before leases it was
   ``PIPELINE_RUNNING_TIMEOUT_SECONDS`` (3600 s) plus an interval.
B. **long step**: ``entity_canon``'s one call takes ten leases. Measured: that it completes
   in one run, with one provider call and no takeover (the heartbeat keeps the lease).

    .venv/bin/python benchmarks/recovery.py            # ~3 min on 2 cores

Prints one JSON object; BENCHMARKS.md "Recovery" records a run.
"""

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline_defs.resume.partition import Episode  # noqa: E402
from pipeline_defs.storyboard import sample_stories  # noqa: E402
from resources.ledger.store import LedgerStore  # noqa: E402

PARTITION = "demo/ep01"
STEP = "entity_canon"
SENSOR_INTERVAL = 30  # the shipped resume_sensor interval
DAGSTER_YAML = """
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config: {max_concurrent_runs: 4, dequeue_interval_seconds: 1}
run_monitoring: {enabled: true, poll_interval_seconds: 5}
telemetry: {enabled: false}
nux: {enabled: false}
"""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def deployment(root: Path, env: dict[str, str]) -> Iterator[None]:
    """``dagster dev`` in its own process group, stopped by that group."""
    log = (root / "dagster_dev.log").open("wb")
    dagster = str(Path(sys.executable).with_name("dagster"))
    process = subprocess.Popen(
        [dagster, "dev", "-w", str(ROOT / "workspace.yaml"), "-p", str(_port())],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def _home(root: Path, heartbeat: float, lease: float, latency_s: float) -> dict[str, str]:
    home, dagster_home = root / "home", root / "dagster_home"
    dagster_home.mkdir(parents=True)
    (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)
    env = {
        **os.environ,
        "PIPELINE_HOME": str(home),
        "DAGSTER_HOME": str(dagster_home),
        "PIPELINE_HEARTBEAT_SECONDS": str(heartbeat),
        "PIPELINE_LEASE_SECONDS": str(lease),
        "PIPELINE_OFFLINE_LATENCY_MS": str(int(latency_s * 1000)),
    }
    for name in ("PIPELINE_DB_URL", "STORYBOARD_DEFS"):
        env.pop(name, None)
    episode = Episode.parse(PARTITION)
    storyboard = str(Path(sys.executable).with_name("storyboard"))
    subprocess.run(
        [storyboard, "add-episode", "--project", episode.project_id, "--episode",
         episode.episode_id, "--story", str(sample_stories()["ep01"])],
        env=env, check=True, capture_output=True, cwd=root,
    )  # fmt: skip
    return env


def _row(ledger: LedgerStore) -> dict[str, Any]:
    return ledger.get(Episode.parse(PARTITION).step(STEP)) or {}


def _wait(what: str, predicate: Any, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.1)
    raise TimeoutError(what)


def _calls(ledger: LedgerStore) -> int:
    return len(ledger.provider_calls(Episode.parse(PARTITION).step(STEP)))


def scenario_kill(heartbeat: float, lease: float, latency_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_recovery_") as tmp:
        root = Path(tmp)
        env = _home(root, heartbeat, lease, latency_s)
        ledger = LedgerStore(f"sqlite:///{root / 'home' / 'ledger.sqlite3'}")
        with deployment(root, env):
            _wait("the first claim", lambda: _row(ledger).get("status") == "running", 300)
            first = _row(ledger)
            time.sleep(min(2.0, latency_s / 2))  # mid-call
            pid = int(str(first["lock_owner"]).rsplit("/", 1)[1])
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            took_over = _wait(
                "the takeover",
                lambda: _row(ledger).get("run_id") not in (None, first["run_id"]),
                600,
            )
            done = _wait("completed", lambda: _row(ledger).get("status") == "completed", 600)
        return {
            "kill_to_takeover_s": round(took_over - killed, 1),
            "kill_to_completed_s": round(done - killed, 1),
            "bound_s": lease + SENSOR_INTERVAL,
            "before_leases_bound_s": 3600 + SENSOR_INTERVAL,
            "provider_calls": _calls(ledger),
            "recovery_count": _row(ledger).get("recovery_count"),
        }


def scenario_long_step(heartbeat: float, lease: float) -> dict[str, Any]:
    latency_s = 10 * lease
    with tempfile.TemporaryDirectory(prefix="bench_recovery_") as tmp:
        root = Path(tmp)
        env = _home(root, heartbeat, lease, latency_s)
        ledger = LedgerStore(f"sqlite:///{root / 'home' / 'ledger.sqlite3'}")
        with deployment(root, env):
            _wait("the claim", lambda: _row(ledger).get("status") == "running", 300)
            owner = _row(ledger)["run_id"]
            started = time.monotonic()
            _wait("completed", lambda: _row(ledger).get("status") == "completed", 600)
            took = time.monotonic() - started
        row = _row(ledger)
        return {
            "step_seconds": round(took, 1),
            "lease_s": lease,
            "same_owner": row["run_id"] == owner,
            "provider_calls": _calls(ledger),
            "recovery_count": row["recovery_count"],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heartbeat", type=float, default=2.0)
    parser.add_argument("--lease", type=float, default=10.0)
    parser.add_argument("--latency", type=float, default=8.0, help="seconds per model call")
    args = parser.parse_args()
    result = {
        "settings": {
            "heartbeat_s": args.heartbeat,
            "lease_s": args.lease,
            "sensor_interval_s": SENSOR_INTERVAL,
            "call_latency_s": args.latency,
        },
        "kill": scenario_kill(args.heartbeat, args.lease, args.latency),
        "long_step": scenario_long_step(args.heartbeat / 2, args.lease / 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
