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
C. **new episode** (docs/DESIGN.md#sensor): ``storyboard add-episode`` while ``dagster dev``
   runs (its sensor has ticked) → seconds until all ten steps are completed, the runs the
   sensor launched for it, and the wait for the launching tick; against the CLI doing the
   same work (``storyboard materialize`` of a freshly added episode, no ``dagster dev``).
D. **force**: ``storyboard force --step entity_t2i`` on that episode (it stales the four
   steps below) → seconds until those four are completed again; against the CLI doing the
   same work (the same force, then ``storyboard materialize``).

C and D use the offline models without latency by default (``--run-latency``): the ratio
is then the sensor's and Dagster's own overhead. Target: one sensor interval plus 1.5x
the CLI time.

    .venv/bin/python benchmarks/recovery.py            # ~5 min on 2 cores
    .venv/bin/python benchmarks/recovery.py --scenarios new_episode,force

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
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dagster as dg  # noqa: E402

from pipeline_defs.resume.partition import Episode  # noqa: E402
from pipeline_defs.resume.status import LedgerRow  # noqa: E402
from pipeline_defs.steps.graph import StepGraph  # noqa: E402
from pipeline_defs.storyboard import STORYBOARD_STEPS, sample_stories  # noqa: E402
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
def deployment(root: Path, env: dict[str, str]) -> Iterator[str]:
    """``dagster dev`` in its own process group, stopped by that group; yields its URL."""
    log = (root / "dagster_dev.log").open("wb")
    dagster = str(Path(sys.executable).with_name("dagster"))
    port = _port()
    process = subprocess.Popen(
        [dagster, "dev", "-w", str(ROOT / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
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


def _home(
    root: Path, heartbeat: float, lease: float, latency_s: float, *, episode: bool = True
) -> dict[str, str]:
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
        # The code under test is this checkout's, whichever package the venv installed.
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    for name in ("PIPELINE_DB_URL", "STORYBOARD_DEFS"):
        env.pop(name, None)
    if episode:
        _storyboard(env, root, "add-episode", *_EPISODE_ARGS)
    return env


_EPISODE_ARGS = (
    "--project", Episode.parse(PARTITION).project_id,
    "--episode", Episode.parse(PARTITION).episode_id,
    "--story", str(sample_stories()["ep01"]),
)  # fmt: skip


def _storyboard(env: dict[str, str], cwd: Path, *args: str) -> float:
    """``storyboard ARGS`` as an operator runs it (its own process); its wall-clock seconds."""
    storyboard = str(Path(sys.executable).with_name("storyboard"))
    started = time.monotonic()
    subprocess.run([storyboard, *args], env=env, check=True, capture_output=True, cwd=cwd)
    return time.monotonic() - started


def _row(ledger: LedgerStore) -> LedgerRow:
    return (
        ledger.get(Episode.parse(PARTITION).step(STEP)) or LedgerRow()
    )  # no row yet: every column None


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
            _wait("the first claim", lambda: _row(ledger).status == "running", 300)
            first = _row(ledger)
            time.sleep(min(2.0, latency_s / 2))  # mid-call
            pid = int(str(first.lock_owner).rsplit("/", 1)[1])
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            took_over = _wait(
                "the takeover",
                lambda: _row(ledger).run_id not in (None, first.run_id),
                600,
            )
            done = _wait("completed", lambda: _row(ledger).status == "completed", 600)
        return {
            "kill_to_takeover_s": round(took_over - killed, 1),
            "kill_to_completed_s": round(done - killed, 1),
            "bound_s": lease + SENSOR_INTERVAL,
            "before_leases_bound_s": 3600 + SENSOR_INTERVAL,
            "provider_calls": _calls(ledger),
            "recovery_count": _row(ledger).recovery_count,
        }


def scenario_long_step(heartbeat: float, lease: float) -> dict[str, Any]:
    latency_s = 10 * lease
    with tempfile.TemporaryDirectory(prefix="bench_recovery_") as tmp:
        root = Path(tmp)
        env = _home(root, heartbeat, lease, latency_s)
        ledger = LedgerStore(f"sqlite:///{root / 'home' / 'ledger.sqlite3'}")
        with deployment(root, env):
            _wait("the claim", lambda: _row(ledger).status == "running", 300)
            owner = _row(ledger).run_id
            started = time.monotonic()
            _wait("completed", lambda: _row(ledger).status == "completed", 600)
            took = time.monotonic() - started
        row = _row(ledger)
        return {
            "step_seconds": round(took, 1),
            "lease_s": lease,
            "same_owner": row.run_id == owner,
            "provider_calls": _calls(ledger),
            "recovery_count": row.recovery_count,
        }


# ----------------------------------------------------------------------------- C and D
ORDERED = tuple(s.step_id for s in StepGraph(STORYBOARD_STEPS).ordered)
FORCED = "entity_t2i"
BELOW_FORCED = StepGraph(STORYBOARD_STEPS).downstream(FORCED)
TICKS_QUERY = """
query { sensorOrError(sensorSelector: {repositoryLocationName: "storyboard",
    repositoryName: "__repository__", sensorName: "resume_sensor"}) {
  ... on Sensor { sensorState { ticks(limit: 1000) { status timestamp } } } } }
"""


def _ticks(url: str) -> list[dict[str, Any]]:
    """The resume sensor's ticks so far (none while the code location loads)."""
    body = json.dumps({"query": TICKS_QUERY}).encode()
    request = urllib.request.Request(
        f"{url}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            data = json.loads(response.read())["data"]["sensorOrError"]
    except (OSError, KeyError, TypeError, ValueError):
        return []
    return list((data or {}).get("sensorState", {}).get("ticks", []))


def _statuses(ledger: LedgerStore, steps: tuple[str, ...]) -> Callable[[], bool]:
    episode = Episode.parse(PARTITION)

    def completed() -> bool:
        rows = ledger.get_many(episodes=[episode], step_ids=steps)
        return len(rows) == len(steps) and all(r.status == "completed" for r in rows.values())

    return completed


def _step_runs(instance: dg.DagsterInstance, since: float) -> list[dg.RunRecord]:
    """Runs of the steps' job for the partition created after ``since`` (epoch seconds)."""
    records = instance.get_run_records(dg.RunsFilter(tags={"dagster/partition": PARTITION}))
    return [r for r in records if r.create_timestamp.timestamp() >= since]


def _sensor_side(
    url: str, instance: dg.DagsterInstance, ledger: LedgerStore, steps: tuple[str, ...]
) -> Callable[[Callable[[], None]], dict[str, Any]]:
    """A measure of one action under the sensor: from its end to ``steps`` completed."""

    def measure(action: Callable[[], None]) -> dict[str, Any]:
        began = time.time()
        action()
        acted, wall = time.monotonic(), time.time()
        done = _wait(f"{steps} completed", _statuses(ledger, steps), 900)
        runs = [r for r in _step_runs(instance, began) if r.dagster_run.job_name == "resume_steps"]

        def ended() -> bool:
            return all(
                (instance.get_run_by_id(r.dagster_run.run_id) or r.dagster_run).is_finished
                for r in runs
            )

        _wait("the runs to end", ended, 300)
        first = min((r.create_timestamp.timestamp() for r in runs), default=wall)
        waited = max(0.0, first - wall)
        return {
            "seconds": round(done - acted, 1),
            "to_launching_tick_s": round(waited, 1),
            "run_s": round(done - acted - waited, 1),
            "sensor_runs": len(runs),
            "steps_per_run": [len(r.dagster_run.asset_selection or ()) for r in runs],
            "ticks": len([t for t in _ticks(url) if t["timestamp"] >= began]),
        }

    return measure


def scenario_one_run(run_latency_s: float) -> dict[str, Any]:
    """C and D under ``dagster dev``, each next to the CLI doing the same work."""
    with tempfile.TemporaryDirectory(prefix="bench_one_run_") as tmp:
        root = Path(tmp)
        # The CLI doing the same work, on a home of its own (no dagster dev, no sensor).
        cli_root = root / "cli"
        cli_env = _home(cli_root, 20.0, 60.0, run_latency_s)
        cli_new = _storyboard(cli_env, cli_root, "materialize", "--partition", PARTITION)
        _storyboard(cli_env, cli_root, "force", "--partition", PARTITION, "--step", FORCED)
        cli_force = _storyboard(cli_env, cli_root, "materialize", "--partition", PARTITION)

        dev_root = root / "dev"
        env = _home(dev_root, 20.0, 60.0, run_latency_s, episode=False)
        instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
        ledger = LedgerStore(f"sqlite:///{dev_root / 'home' / 'ledger.sqlite3'}")
        try:
            with deployment(dev_root, env) as url:
                _wait("the sensor's first tick", lambda: len(_ticks(url)) > 0, 600)

                def add() -> None:
                    _storyboard(env, dev_root, "add-episode", *_EPISODE_ARGS)

                def force_it() -> None:  # through the CLI, as an operator does; its run ends
                    _storyboard(env, dev_root, "force", "--partition", PARTITION, "--step", FORCED)

                new = _sensor_side(url, instance, ledger, ORDERED)(add)
                force = _sensor_side(url, instance, ledger, BELOW_FORCED)(force_it)
        finally:
            instance.dispose()
    bound_new = SENSOR_INTERVAL + 1.5 * cli_new
    bound_force = SENSOR_INTERVAL + 1.5 * cli_force
    return {
        "new_episode": {
            **new,
            "cli_materialize_s": round(cli_new, 1),
            "ratio_to_cli": round(new["seconds"] / cli_new, 1),
            "target_s": round(bound_new, 1),
            "met": new["seconds"] <= bound_new,
        },
        "force_entity_t2i": {
            **force,
            "cli_materialize_s": round(cli_force, 1),
            "ratio_to_cli": round(force["seconds"] / cli_force, 1),
            "target_s": round(bound_force, 1),
            "met": force["seconds"] <= bound_force,
        },
    }


SCENARIOS = ("kill", "long_step", "new_episode", "force")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--heartbeat", type=float, default=2.0, help="lease heartbeat, seconds (default 2)"
    )
    parser.add_argument(
        "--lease", type=float, default=10.0, help="lease length, seconds (default 10)"
    )
    parser.add_argument("--latency", type=float, default=8.0, help="seconds per model call")
    parser.add_argument(
        "--run-latency", type=float, default=0.0, help="seconds per model call in C and D"
    )
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"comma-separated of {SCENARIOS}"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a short run (CI): the long step only, a lease of 1 s (a 10 s step), about a "
        "minute with dagster dev's start",
    )
    args = parser.parse_args()
    if args.smoke:
        args.scenarios, args.heartbeat, args.lease = "long_step", 1.0, 2.0
    chosen = {s.strip() for s in args.scenarios.split(",") if s.strip()}
    result: dict[str, Any] = {
        "settings": {
            "heartbeat_s": args.heartbeat,
            "lease_s": args.lease,
            "sensor_interval_s": SENSOR_INTERVAL,
            "call_latency_s": args.latency,
            "run_call_latency_s": args.run_latency,
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0],
        },
    }
    if "kill" in chosen:
        result["kill"] = scenario_kill(args.heartbeat, args.lease, args.latency)
    if "long_step" in chosen:
        result["long_step"] = scenario_long_step(args.heartbeat / 2, args.lease / 2)
    if chosen & {"new_episode", "force"}:
        result.update(scenario_one_run(args.run_latency))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
