"""Ledger claim throughput on PostgreSQL against a pgbench ceiling (docs/DESIGN.md#claims).

One *cycle* is what a step does with the ledger around its body: ``LedgerStore.claim`` (one
INSERT ... ON CONFLICT DO UPDATE ... RETURNING transaction) followed by the owner-aware
``LedgerStore.transition(..., "completed")`` (one UPDATE transaction). Each worker is a
separate process with its own engine, exactly like Dagster run workers.

- distinct keys: every worker cycles over its own 1000 keys (first pass inserts, then the
  claim takes its own completed rows back);
- hot key: every worker claims the same key each cycle; a cycle counts only when the claim
  won and the transition went through, refused claims are counted separately.

A second pgbench script, ``benchmarks/pgbench_cycle.sql``, replays our cycle statement for
statement (ping, BEGIN, upsert, COMMIT, ping, BEGIN, owner-aware UPDATE, COMMIT) from C, to
separate the cost of the SQL and commits from the cost of the Python client.

The ceiling is ``pgbench`` running ``benchmarks/pgbench_upsert.sql`` (one single-row upsert
transaction with the claim's shape on a ``LIKE step_run`` table, the same number of keys per
client) with the same client count and duration. Everything runs in a fresh database that
is created and dropped by this script.

    .venv/bin/python benchmarks/claims.py --seconds 5
"""

import argparse
import glob
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/claims.py` from any directory
    sys.path.insert(0, str(ROOT))

from pipeline_defs.resume.partition import StepKey  # noqa: E402
from resources.ledger.audit import Audit  # noqa: E402
from resources.ledger.store import LedgerStore, engine_for  # noqa: E402

PGBENCH_SCRIPT = Path(__file__).with_name("pgbench_upsert.sql")
PGBENCH_CYCLE_SCRIPT = Path(__file__).with_name("pgbench_cycle.sql")
KEYS_PER_WORKER = 1000
TARGET = 0.50


@dataclass
class Ours:
    cycles: int
    rejected: int
    lost: int
    seconds: float
    client_cpu: float  # seconds of CPU used by our worker processes while measuring
    server_cpu: float  # seconds of CPU used by their PostgreSQL backends (-1: unknown)

    @property
    def attempts(self) -> int:
        return self.cycles + self.rejected + self.lost

    @property
    def rate(self) -> float:
        return self.cycles / self.seconds

    @property
    def rejected_rate(self) -> float:
        return self.rejected / self.seconds


def _backend_cpu(pid: int) -> float:
    """utime + stime of a local PostgreSQL backend in seconds; -1 when /proc is unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return -1.0


def _worker(
    url: str,
    index: int,
    mode: str,
    tag: str,
    seconds: float,
    barrier: Any,
    results: Any,
    audit: str = "none",
) -> None:
    try:
        store = LedgerStore(url)
        store.migrate()
        store.get(StepKey("bench", "warmup", "step"))  # open the pooled connection up front
        with store.engine.connect() as conn:  # the one pooled connection every op reuses
            backend = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
        barrier.wait(120)
        cycles = rejected = lost = 0
        i = 0
        server0, client0 = _backend_cpu(backend), time.process_time()
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            if mode == "distinct":
                key = StepKey("bench", f"{tag}w{index}e{i % KEYS_PER_WORKER}", "step")
            else:
                key = StepKey("bench", f"{tag}hot", "step")
            run_id = f"{tag}-w{index}-{i}"
            i += 1
            if audit == "none":
                won = store.claim(key, run_id)
                done = won and store.transition(key, run_id, "completed")
            elif audit == "together":  # the run protocol now: each line in its change's txn
                start = Audit("rerun_self", None, "running", run_id=run_id)
                won = store.claim(key, run_id, audit=start)
                finish = Audit("finish", "running", "completed", run_id=run_id)
                done = won and store.transition(key, run_id, "completed", audit=finish)
            else:  # "apart": the protocol before, each line a transaction after its change
                won = store.claim(key, run_id)
                if won:
                    store.append_transition(
                        key, action="rerun_self", from_status=None, to_status="running",
                        run_id=run_id,
                    )  # fmt: skip
                done = won and store.transition(key, run_id, "completed")
                if done:
                    store.append_transition(
                        key, action="finish", from_status="running", to_status="completed",
                        run_id=run_id,
                    )  # fmt: skip
            if not won:
                rejected += 1
            elif done:
                cycles += 1
            else:
                lost += 1
        elapsed = time.perf_counter() - started
        client = time.process_time() - client0
        server1 = _backend_cpu(backend)
        server = server1 - server0 if min(server0, server1) >= 0 else -1.0
        results.put(("ok", index, cycles, rejected, lost, elapsed, client, server))
    except BaseException as exc:
        barrier.abort()
        results.put(("error", index, f"{type(exc).__name__}: {exc}", 0, 0, 0.0, 0.0, 0.0))


def _reset(url: str) -> None:
    with engine_for(url).begin() as conn:
        conn.exec_driver_sql("TRUNCATE step_run, step_transition, pgbench_step_run")
    with engine_for(url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("CHECKPOINT")


def run_ours(url: str, workers: int, mode: str, seconds: float, audit: str = "none") -> Ours:
    _reset(url)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    results = ctx.Queue()
    tag = f"{mode[0]}{workers}{audit[0]}"
    procs = [
        ctx.Process(target=_worker, args=(url, i, mode, tag, seconds, barrier, results, audit))
        for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(120)
        outcomes = [results.get(timeout=seconds + 120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
    errors = [o for o in outcomes if o[0] != "ok"]
    if errors:
        raise SystemExit(f"worker failed: {errors[0][2]}")
    return Ours(
        cycles=sum(o[2] for o in outcomes),
        rejected=sum(o[3] for o in outcomes),
        lost=sum(o[4] for o in outcomes),
        seconds=max(o[5] for o in outcomes),
        client_cpu=sum(o[6] for o in outcomes),
        server_cpu=-1.0 if any(o[7] < 0 for o in outcomes) else sum(o[7] for o in outcomes),
    )


def find_pgbench() -> str:
    found = shutil.which("pgbench") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"), reverse=True)), None
    )
    if found is None:
        raise SystemExit(
            "pgbench not found (apt-get install postgresql-client / postgresql-contrib)"
        )
    return found


def run_pgbench(
    pgbench: str, url: str, clients: int, seconds: float, script: Path = PGBENCH_SCRIPT
) -> float:
    _reset(url)
    u = sa.make_url(url)
    cmd = [
        pgbench,
        "-n",
        "-M",
        "prepared",
        "-c",
        str(clients),
        "-j",
        str(clients),
        "-T",
        str(max(1, round(seconds))),
        "-D",
        f"keys={KEYS_PER_WORKER * clients}",
        "-f",
        str(script),
        "-h",
        u.host or "127.0.0.1",
        "-p",
        str(u.port or 5432),
        "-U",
        u.username or "postgres",
        str(u.database),
    ]
    env = dict(os.environ)
    if u.password:
        env["PGPASSWORD"] = u.password
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0 and hasattr(os, "geteuid") and os.geteuid() == 0:
        proc = subprocess.run(
            ["runuser", "-u", "postgres", "--", *cmd],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
    match = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", proc.stdout)
    if proc.returncode != 0 or match is None:
        raise SystemExit(f"pgbench failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return float(match.group(1))


def _machine(url: str) -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    with engine_for(url).connect() as conn:
        version = conn.exec_driver_sql("SHOW server_version").scalar()
        sync = conn.exec_driver_sql("SHOW synchronous_commit").scalar()
    return (
        f"{os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, PostgreSQL {version} "
        f"(synchronous_commit={sync}) on the same host"
    )


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("PIPELINE_BENCH_PG_URL")
        or os.environ.get("PIPELINE_TEST_PG_URL")
        or "postgresql+psycopg://postgres@127.0.0.1:5432/test",
        help="a database on the server; a fresh bench database is created next to it "
        "(default: PIPELINE_BENCH_PG_URL, else PIPELINE_TEST_PG_URL, else the local test db)",
    )
    parser.add_argument(
        "--db-prefix",
        default="bench_claims",
        help="name prefix of the database it creates and drops (default bench_claims)",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    parser.add_argument("--workers", default="1,4,8", help="comma-separated worker/client counts")
    parser.add_argument(
        "--audit-only",
        action="store_true",
        help="only compare audit lines in their change's transaction with audits apart",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a short run (CI): 1 worker, 1 s per measurement"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.seconds, args.workers = 1.0, "1"
    counts = [int(w) for w in args.workers.split(",") if w.strip()]
    pgbench = find_pgbench()

    admin = sa.create_engine(args.pg_url, isolation_level="AUTOCOMMIT")
    name = f"{args.db_prefix}_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
    try:
        LedgerStore(url).migrate()
        with engine_for(url).begin() as conn:
            conn.exec_driver_sql("CREATE TABLE pgbench_step_run (LIKE step_run INCLUDING ALL)")
        print(f"machine: {_machine(url)}")
        print(f"load average before: {_load()}")
        print(f"pgbench: {pgbench}; {args.seconds:g} s per measurement; database {name}")
        audited = []
        for n in counts:  # alternated, same database: the ratio is the figure
            apart = run_ours(url, n, "distinct", args.seconds, audit="apart")
            together = run_ours(url, n, "distinct", args.seconds, audit="together")
            audited.append((n, apart, together))
            print(
                f"  {n} workers with audit lines: apart {apart.rate:.0f} cycles/s (4 txn), "
                f"together {together.rate:.0f} cycles/s (2 txn), "
                f"together / apart {together.rate / apart.rate:.2f}",
                flush=True,
            )
        rows = []
        for n in counts if not args.audit_only else []:
            distinct = run_ours(url, n, "distinct", args.seconds)
            hot = run_ours(url, n, "hot", args.seconds)
            tps = run_pgbench(pgbench, url, n, args.seconds)
            replay = run_pgbench(pgbench, url, n, args.seconds, PGBENCH_CYCLE_SCRIPT)
            rows.append((n, distinct, hot, tps, replay))
            print(
                f"  {n} workers: distinct {distinct.rate:.0f} cycles/s, "
                f"hot {hot.rate:.0f} cycles/s ({hot.rejected_rate:.0f} refused claims/s), "
                f"pgbench upsert {tps:.0f} tps, pgbench replay of our cycle {replay:.0f} cycles/s",
                flush=True,
            )
    finally:
        engine_for(url).dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()

    print(f"load average after: {_load()}")
    print()
    print(
        "| workers | cycle with audits apart (4 txn), cycles/s | audits in the change's txn "
        "(2 txn), cycles/s | together / apart |"
    )
    print("|---:|---:|---:|---:|")
    for n, apart, together in audited:
        print(
            f"| {n} | {apart.rate:.0f} | {together.rate:.0f} | {together.rate / apart.rate:.2f} |"
        )
    if args.audit_only:
        return 0
    print()
    print(
        "| workers | ours cycles/s (distinct) | ours txn/s (2 per cycle) | pgbench upsert tps "
        "| ratio per cycle | ratio per txn | pgbench replay of our cycle, cycles/s "
        "| ours / replay | hot key cycles/s | hot key refused claims/s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, distinct, hot, tps, replay in rows:
        print(
            f"| {n} | {distinct.rate:.0f} | {2 * distinct.rate:.0f} | {tps:.0f} "
            f"| {distinct.rate / tps:.0%} | {2 * distinct.rate / tps:.0%} "
            f"| {replay:.0f} | {distinct.rate / replay:.0%} "
            f"| {hot.rate:.0f} | {hot.rejected_rate:.0f} |"
        )
    cores = os.cpu_count() or 1
    print()
    print(
        "| workers (distinct keys) | client CPU ms/cycle | PostgreSQL backend CPU ms/cycle "
        f"| CPU-only ceiling on {cores} cores, cycles/s |"
    )
    print("|---:|---:|---:|---:|")
    for n, distinct, _, _, _ in rows:
        client = 1000 * distinct.client_cpu / max(1, distinct.cycles)
        if distinct.server_cpu >= 0:
            server = 1000 * distinct.server_cpu / max(1, distinct.cycles)
            ceiling = f"{cores * 1000 / (client + server):.0f}"
            server_text = f"{server:.2f}"
        else:
            server_text, ceiling = "n/a", f"{cores * 1000 / client:.0f} (client only)"
        print(f"| {n} | {client:.2f} | {server_text} | {ceiling} |")
    lost = sum(r[1].lost + r[2].lost for r in rows)
    print(f"\nownership lost between claim and transition (must be 0): {lost}")
    eight = [r for r in rows if r[0] == 8]
    if eight:
        _, distinct, _, tps, _ = eight[0]
        per_cycle, per_txn = distinct.rate / tps, 2 * distinct.rate / tps
        verdict = "meets" if per_cycle >= TARGET else "is UNDER"
        print(
            f"8-worker distinct keys: {per_cycle:.0%} of pgbench per cycle, {per_txn:.0%} per "
            f"transaction; the per-cycle figure {verdict} the {TARGET:.0%} target"
        )
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main())
