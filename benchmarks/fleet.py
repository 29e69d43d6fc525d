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

Where the rest goes, per task, from the timestamps of the run's event log (each worker runs
one step at a time, so its tasks follow each other): "idle" is a worker waiting for a step to
be sent (none was ready: the episodes' chains, the coordinator's polling), "task before
step" the time from the previous step's end (or the task's sending, when the worker was
idle) to the worker's "Executing steps" event (the previous task's events sent back, the
broker, the instance and plan built for the task), "to STEP_START" the time from that event
to the step's start (Dagster's step setup: resources, run protocol's claim), and "end to
next send" the time from a step's end to the run's next step sent (the coordinator noticing:
the result sent back and its poll tick).

    .venv/bin/python benchmarks/fleet.py [--episodes 4] [--latency-ms 1500] [--workers 1,2,4]
    .venv/bin/python benchmarks/fleet.py --smoke    # CI: small; fails when calls differ

Absolute times differ between machines; the speed-up is the figure (target: 4 workers at
least 3.6x one worker with 1.5 s calls, zero double calls).
"""

import argparse
import itertools
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import dagster as dg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from fleet_support import BACKEND_URL, BROKER_URL, broker_problem, delete_queue  # noqa: E402

from pipeline_defs.resume.fleet_settings import FLEET_ENV_NAMES  # noqa: E402
from pipeline_defs.resume.settings import ENV_NAMES  # noqa: E402
from pipeline_defs.storyboard import sample_stories  # noqa: E402
from resources.ledger.store import LedgerStore  # noqa: E402

PG_URL = os.environ.get(
    "PIPELINE_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
SMOKE = {"episodes": 2, "latency_ms": 50, "workers": "1,2"}
STORYBOARD = str(Path(sys.executable).with_name("storyboard"))


@dataclass(frozen=True)
class Setup:
    """Where a measure runs: the PostgreSQL server and its databases' names, the broker,
    the result backend and the queue."""

    pg_url: str
    db_prefix: str
    broker_url: str
    backend_url: str
    queue: str | None  # None: one of the measure's own


def create_db(pg_url: str, name: str) -> str:
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    return sa.make_url(pg_url).set(database=name).render_as_string(hide_password=False)


def drop_db(pg_url: str, name: str) -> None:
    admin = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def run(env: dict[str, str], cwd: Path, *args: str) -> None:
    done = subprocess.run(
        [STORYBOARD, *args], env=env, cwd=cwd, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"storyboard {' '.join(args)} failed:\n{done.stdout}{done.stderr}")


@dataclass
class Tasks:
    """Per task, from the event log (seconds): what a measure prints besides its wall time."""

    busy: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    steps: int = 0
    idle: list[float] = field(default_factory=list)
    before_step: list[float] = field(default_factory=list)
    to_start: list[float] = field(default_factory=list)
    to_next_send: list[float] = field(default_factory=list)
    submit_to_start: list[float] = field(default_factory=list)


def read_tasks(instance: dg.DagsterInstance) -> Tasks:
    """The tasks of every run in ``instance``, timed from its event log."""
    tasks = Tasks()
    # per worker: (task's "Executing" event, its step's start, its end, its sending)
    by_worker: dict[str, list[tuple[float, float, float, float]]] = defaultdict(list)
    for record in instance.get_run_records():
        sent: dict[str, float] = {}
        executing: dict[str, float] = {}
        starts: dict[str, float] = {}
        ends: dict[str, float] = {}
        node_of: dict[str, str] = {}
        for entry in instance.all_logs(record.dagster_run.run_id):
            event = entry.dagster_event
            if event is None or entry.step_key is None:
                continue
            key, at = entry.step_key, entry.timestamp
            if event.event_type_value == "ENGINE_EVENT":
                message = event.message or ""
                if "Submitting celery task" in message:
                    sent[key] = at
                elif "in celery worker" in message:
                    executing[key] = at
                    meta = event.engine_event_data.metadata
                    node_of[key] = str(meta["Celery worker"].value)
            elif event.event_type_value == "STEP_START":
                starts[key] = at
            elif event.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE"):
                ends[key] = at
        for key, end in ends.items():
            if key not in starts:
                continue
            tasks.busy[node_of.get(key, "?")] += end - starts[key]
            tasks.steps += 1
            if key in sent:
                tasks.submit_to_start.append(starts[key] - sent[key])
            if key in executing:
                tasks.to_start.append(starts[key] - executing[key])
                if key in sent:
                    by_worker[node_of[key]].append((executing[key], starts[key], end, sent[key]))
        run_ends = sorted(ends.values())
        for at in sent.values():
            before = [end for end in run_ends if end <= at]
            if before:
                tasks.to_next_send.append(at - before[-1])
    for timeline in by_worker.values():
        timeline.sort()
        for (_, _, previous_end, _), (executing_at, _, _, sent_at) in itertools.pairwise(timeline):
            ready = max(previous_end, sent_at)
            tasks.idle.append(max(0.0, sent_at - previous_end))
            tasks.before_step.append(executing_at - ready)
    return tasks


def measure(setup: Setup, workers: int, episodes: int, latency_ms: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    tag = uuid.uuid4().hex[:10]
    ledger_db, dagster_db = f"{setup.db_prefix}_ledger_{tag}", f"{setup.db_prefix}_dagster_{tag}"
    queue = setup.queue or f"bench-fleet-{tag}"
    made: list[str] = []
    started: list[subprocess.Popen[bytes]] = []
    try:
        ledger_url = create_db(setup.pg_url, ledger_db)
        made.append(ledger_db)
        dagster_url = create_db(setup.pg_url, dagster_db)
        made.append(dagster_db)
        pg_url = sa.make_url(dagster_url).set(drivername="postgresql+psycopg2")
        pg_text = pg_url.render_as_string(hide_password=False)
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
                "DAGSTER_PG_URL": pg_text,
                "PIPELINE_DB_URL": ledger_url,
                "PIPELINE_EXECUTOR": "celery",
                "PIPELINE_CELERY_BROKER_URL": setup.broker_url,
                "PIPELINE_CELERY_BACKEND_URL": setup.backend_url,
                "PIPELINE_CELERY_QUEUE": queue,
                "PIPELINE_OFFLINE_LATENCY_MS": str(latency_ms),
            }
        )
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
            if all(" on " in text and "at once" in text for text in logs):
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
        os.environ["DAGSTER_PG_URL"] = pg_text
        instance = dg.DagsterInstance.from_config(str(root / "dagster_home"))
        tasks = read_tasks(instance)
        ledger = LedgerStore(ledger_url)
        calls = ledger.provider_calls()
        model_seconds = len(calls) * latency_ms / 1000
        total_busy = sum(tasks.busy.values())
        instance.dispose()
        ledger.engine.dispose()
        return {
            "workers": workers,
            "wall": wall,
            "steps": tasks.steps,
            "calls": len(calls),
            "busy": sorted(b / wall for b in tasks.busy.values()),
            "wait": _mean(tasks.submit_to_start),
            "outside": (total_busy - model_seconds) / max(tasks.steps, 1),
            "idle": _mean(tasks.idle),
            "before_step": _mean(tasks.before_step),
            "to_start": _mean(tasks.to_start),
            "to_next_send": _mean(tasks.to_next_send),
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
        delete_queue(setup.broker_url, queue)
        for name in made:
            drop_db(setup.pg_url, name)
        shutil.rmtree(root, ignore_errors=True)


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else 0.0


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
        "its own ledger and Dagster databases and (unless --queue) its own queue, so two "
        "people can run it on one machine",
    )
    parser.add_argument(
        "--pg-url",
        default=PG_URL,
        help="the PostgreSQL server the measures' databases are created on and dropped from "
        "(a SQLAlchemy URL; its database is only connected to; default "
        "$PIPELINE_BENCH_PG_URL, else postgresql+psycopg://postgres@127.0.0.1:5432/test)",
    )
    parser.add_argument(
        "--db-prefix",
        default="bench_fleet",
        help="the start of the databases' names: PREFIX_ledger_<random> and "
        "PREFIX_dagster_<random> per measure, dropped after it (default bench_fleet)",
    )
    parser.add_argument(
        "--broker-url",
        default=BROKER_URL,
        help="the Celery broker (default $PIPELINE_TEST_BROKER_URL, else "
        "pyamqp://guest:guest@127.0.0.1:5672//)",
    )
    parser.add_argument(
        "--backend-url",
        default=BACKEND_URL,
        help="the Celery result backend (default $PIPELINE_TEST_BACKEND_URL, else "
        "redis://127.0.0.1:6379/0)",
    )
    parser.add_argument(
        "--queue",
        default=None,
        help="the Celery queue every measure uses, deleted from the broker after each (default: "
        "bench-fleet-<random>, one per measure)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"a small run for CI ({SMOKE['episodes']} episodes, {SMOKE['latency_ms']} ms "
        f"calls, workers {SMOKE['workers']}; --episodes, --latency-ms and --workers are "
        "ignored): exits 1 when a run fails or when the worker counts' provider calls differ "
        "(a double call); its time is printed, never judged",
    )
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.latency_ms, args.workers = (
            SMOKE["episodes"],
            SMOKE["latency_ms"],
            SMOKE["workers"],
        )
    setup = Setup(args.pg_url, args.db_prefix, args.broker_url, args.backend_url, args.queue)
    problem = broker_problem(setup.broker_url, setup.backend_url)
    if problem is not None:
        raise SystemExit(f"the fleet needs its broker and backend: {problem}")
    begin = time.monotonic()
    results = [
        measure(setup, int(n), int(args.episodes), int(args.latency_ms))
        for n in str(args.workers).split(",")
    ]
    took = time.monotonic() - begin
    base = results[0]
    print(
        f"{args.episodes} episodes, offline latency {args.latency_ms} ms per call, "
        f"load average {os.getloadavg()[0]:.1f}, {took:.0f} s in all"
    )
    print("| workers | wall s | steps/s | speed-up | calls | busy share per worker | "
          "submit->start s | step s outside calls | idle s/task | task before step s | "
          "to STEP_START s | end to next send s |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        shares = ", ".join(f"{b:.0%}" for b in r["busy"])
        print(
            f"| {r['workers']} | {r['wall']:.1f} | {r['steps'] / r['wall']:.2f} | "
            f"{base['wall'] / r['wall']:.2f}x | {r['calls']} | {shares} | {r['wait']:.2f} | "
            f"{r['outside']:.2f} | {r['idle']:.2f} | {r['before_step']:.2f} | "
            f"{r['to_start']:.2f} | {r['to_next_send']:.2f} |"
        )
    problems = []
    if len({r["calls"] for r in results}) != 1:
        problems.append("calls differ between worker counts: a double call?")
    for problem in problems:
        print(problem)
    if args.smoke and problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
