"""Fleet throughput: an N-episode backfill on 1, 2 and 4 Celery workers.

Per worker count: a fresh ledger and Dagster instance (PostgreSQL databases of their own,
dropped afterwards), ``storyboard worker --concurrency 1`` processes on the machine's
RabbitMQ and Redis (a queue of the benchmark's own), offline models that wait
``--latency-ms`` per call (``PIPELINE_OFFLINE_LATENCY_MS``: latency-bound steps, as paid model
calls are), and the N episodes launched at once, each by its own ``storyboard materialize``
with ``PIPELINE_EXECUTOR=celery`` (a backfill of N partitions, one run each). The home is one
shared directory on this machine (the fleet's bucket is not what is measured here).

Printed per worker count: wall time from the launches to the last run's end, steps per
second, the speed-up over one worker, each worker's busy share (the time its steps ran,
from Dagster's step start/end events, over the wall time) and the provider calls against
N clean runs (a double call would show). Where the rest goes: the mean time from a step's
task being submitted to the broker to its start on a worker (broker + Celery + Dagster's
job rebuild in the worker), and the mean step time outside model calls (claim, checkpoint,
Dagster event writes).

    .venv/bin/python benchmarks/fleet.py [--episodes 4] [--latency-ms 1500] [--workers 1,2,4]

Absolute times differ between machines; the speed-up is the figure (target: 4 workers at
least 3.2x one worker, zero double calls).
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import dagster as dg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from fleet_support import BROKER_URL, broker_problem, delete_queue  # noqa: E402

from pipeline_defs.resume.fleet_settings import FLEET_ENV_NAMES  # noqa: E402
from pipeline_defs.resume.settings import ENV_NAMES  # noqa: E402
from pipeline_defs.storyboard import sample_stories  # noqa: E402
from resources.ledger.store import LedgerStore  # noqa: E402

PG_URL = os.environ.get(
    "PIPELINE_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
STORYBOARD = str(Path(sys.executable).with_name("storyboard"))


def create_db(prefix: str) -> tuple[str, str]:
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    return name, sa.make_url(PG_URL).set(database=name).render_as_string(hide_password=False)


def drop_db(name: str) -> None:
    admin = sa.create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def run(env: dict[str, str], cwd: Path, *args: str) -> None:
    done = subprocess.run(
        [STORYBOARD, *args], env=env, cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"storyboard {' '.join(args)} failed:\n{done.stdout}{done.stderr}")


def measure(workers: int, episodes: int, latency_ms: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    ledger_db, ledger_url = create_db("bench_fleet_ledger")
    dagster_db, dagster_url = create_db("bench_fleet_dagster")
    queue = f"bench-fleet-{uuid.uuid4().hex[:8]}"
    pg_url = dagster_url.replace("postgresql+psycopg://", "postgresql+psycopg2://")
    (root / "home").mkdir()
    (root / "dagster_home").mkdir()
    shutil.copyfile(ROOT / "deploy" / "dagster.yaml", root / "dagster_home" / "dagster.yaml")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ENV_NAMES.values() and k not in FLEET_ENV_NAMES and k != "STORYBOARD_DEFS"
    }
    env.update(
        {
            "PIPELINE_HOME": str(root / "home"),
            "DAGSTER_HOME": str(root / "dagster_home"),
            "DAGSTER_PG_URL": pg_url,
            "PIPELINE_DB_URL": ledger_url,
            "PIPELINE_EXECUTOR": "celery",
            "PIPELINE_CELERY_BROKER_URL": BROKER_URL,
            "PIPELINE_CELERY_QUEUE": queue,
            "PIPELINE_OFFLINE_LATENCY_MS": str(latency_ms),
        }
    )
    started: list[subprocess.Popen[bytes]] = []
    try:
        run(env, root, "migrate")
        story = sample_stories()["ep01"]
        partitions = [f"bench/ep{i:02d}" for i in range(episodes)]
        for key in partitions:
            project, episode = key.split("/")
            run(env, root, "add-episode", "--project", project, "--episode", episode,
                "--story", str(story))  # fmt: skip
        for i in range(workers):
            log = (root / f"worker-{i}.log").open("wb")
            started.append(
                subprocess.Popen(
                    [STORYBOARD, "worker", "--concurrency", "1", "--loglevel", "WARNING"],
                    env=env,
                    cwd=root,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        time.sleep(2)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # every worker connected: its banner is written
            logs = [(root / f"worker-{i}.log").read_text() for i in range(workers)]
            if all("on pyamqp://" in text for text in logs):
                break
            time.sleep(0.5)
        time.sleep(3)
        begin = time.monotonic()
        launches = [
            subprocess.Popen(
                [STORYBOARD, "materialize", "--partition", key, "--json"],
                env=env,
                cwd=root,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for key in partitions
        ]
        failed = [p.args for p in launches if p.wait() != 0]
        wall = time.monotonic() - begin
        if failed:
            raise SystemExit(f"runs failed: {failed}")
        os.environ["DAGSTER_PG_URL"] = pg_url
        instance = dg.DagsterInstance.from_config(str(root / "dagster_home"))
        busy: dict[str, float] = defaultdict(float)
        waits: list[float] = []
        outside: list[float] = []
        steps = 0
        for record in instance.get_run_records():
            starts: dict[str, float] = {}
            submitted: dict[str, float] = {}
            node_of: dict[str, str] = {}
            for entry in instance.all_logs(record.dagster_run.run_id):
                event = entry.dagster_event
                if event is None or entry.step_key is None:
                    continue
                key = entry.step_key
                if event.event_type_value == "ENGINE_EVENT":
                    if "Submitting celery task" in (event.message or ""):
                        submitted[key] = entry.timestamp
                    elif "in celery worker" in (event.message or ""):
                        meta = event.engine_event_data.metadata
                        node_of[key] = str(meta["Celery worker"].value)
                elif event.event_type_value == "STEP_START":
                    starts[key] = entry.timestamp
                    if key in submitted:
                        waits.append(entry.timestamp - submitted[key])
                elif event.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE") and key in starts:
                    took = entry.timestamp - starts[key]
                    busy[node_of.get(key, "?")] += took
                    steps += 1
        ledger = LedgerStore(ledger_url)
        calls = ledger.provider_calls()
        per_step_calls: dict[str, int] = defaultdict(int)
        for call in calls:
            per_step_calls[call["step_id"]] += 1
        model_seconds = len(calls) * latency_ms / 1000
        total_busy = sum(busy.values())
        outside.append((total_busy - model_seconds) / max(steps, 1))
        instance.dispose()
        ledger.engine.dispose()
        return {
            "workers": workers,
            "wall": wall,
            "steps": steps,
            "calls": len(calls),
            "busy": sorted(b / wall for b in busy.values()),
            "wait": statistics.mean(waits) if waits else 0.0,
            "outside": outside[0],
        }
    finally:
        for process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in started:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        delete_queue(BROKER_URL, queue)
        drop_db(ledger_db)
        drop_db(dagster_db)
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--episodes", type=int, default=4, help="episodes backfilled per measure (default 4)"
    )
    parser.add_argument(
        "--latency-ms",
        type=int,
        default=1500,
        help="what each offline model call waits, in ms (default 1500)",
    )
    parser.add_argument(
        "--workers",
        default="1,2,4",
        help="worker counts measured side by side, comma separated (default 1,2,4); each gets "
        "its own ledger and Dagster databases and its own queue, so two people can run it on "
        "one machine (PIPELINE_BENCH_PG_URL names the PostgreSQL server)",
    )
    args = parser.parse_args()
    problem = broker_problem()
    if problem is not None:
        raise SystemExit(f"the fleet needs its broker and backend: {problem}")
    results = [measure(int(n), args.episodes, args.latency_ms) for n in args.workers.split(",")]
    base = results[0]
    print(
        f"{args.episodes} episodes, offline latency {args.latency_ms} ms per call, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print("| workers | wall s | steps/s | speed-up | calls | busy share per worker | "
          "submit->start s | step s outside calls |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---|---:|---:|")
    for r in results:
        shares = ", ".join(f"{b:.0%}" for b in r["busy"])
        print(
            f"| {r['workers']} | {r['wall']:.1f} | {r['steps'] / r['wall']:.2f} | "
            f"{base['wall'] / r['wall']:.2f}x | {r['calls']} | {shares} | {r['wait']:.2f} | "
            f"{r['outside']:.2f} |"
        )
    if len({r["calls"] for r in results}) != 1:
        print("calls differ between worker counts: a double call?")


if __name__ == "__main__":
    main()
