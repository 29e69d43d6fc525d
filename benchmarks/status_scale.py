"""What ``storyboard status --partition`` of one episode costs as the ledger grows.

A ledger of ``--small`` episodes, then of ``--episodes`` (the shipped steps of each, with
their rows in ``step_run``, history lines in ``step_transition`` and calls in
``provider_call``, bulk-inserted straight into the ledger's tables), on SQLite and on
PostgreSQL. For each size the script times ``status_report`` of one partition (the median of
``--repeats``, after a warm-up) and counts the SQL statements it sends (SQLAlchemy's
``before_cursor_execute``). Status of one partition reads its rows by episode, so its time
and its statements stay the same whatever the rest of the ledger holds: the figure is the
time at the large size over the time at the small one (goal: about 1x). A statement that
reads a ledger table without an episode filter is listed (none is the goal).

    .venv/bin/python benchmarks/status_scale.py \\
        --pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test

Each PostgreSQL run creates its own database named ``<--db-prefix>_<random>`` (dropped
afterwards unless ``--keep``), so two people can run it against one server.
"""

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/status_scale.py` from anywhere
    sys.path.insert(0, str(ROOT))

from pipeline_defs.operations.status_report import status_report  # noqa: E402
from pipeline_defs.operations.workspace import Workspace, load_definitions, steps_of  # noqa: E402
from resources.ledger.store import LedgerStore, engine_for  # noqa: E402
from resources.ledger.tables import (  # noqa: E402
    episode_calls,
    project_day_spend,
    provider_call,
    step_run,
    step_transition,
)
from resources.pipeline import PipelineResource  # noqa: E402

PROJECT = "bench"
LEDGER_TABLES = ("step_run", "step_transition", "provider_call", "episode_calls")
CHUNK = 5000  # rows per INSERT batch


def episode_id(n: int) -> str:
    return f"ep{n:06d}"


def _rows(first: int, last: int, steps: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Per episode and step: a completed row, two history lines (claim, finish), one call."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for n in range(first, last):
        ep = episode_id(n)
        started = (base + timedelta(seconds=n)).isoformat()
        ended = (base + timedelta(seconds=n, milliseconds=500)).isoformat()
        key = {"project_id": PROJECT, "episode_id": ep}
        yield "episode_calls", {**key, "calls": len(steps), "estimated": len(steps)}
        for step in steps:
            run_id = f"run-{n:06d}"
            yield (
                "step_run",
                {
                    **key,
                    "id": str(uuid.uuid4()),
                    "step_id": step,
                    "status": "completed",
                    "run_id": run_id,
                    "started_at": started,
                    "completed_at": ended,
                    "created_at": started,
                    "updated_at": ended,
                    "recovery_count": 0,
                },
            )
            for action, from_status, to_status, at in (
                ("rerun_self", None, "running", started),
                ("finish", "running", "completed", ended),
            ):
                yield (
                    "step_transition",
                    {
                        **key,
                        "step_id": step,
                        "from_status": from_status,
                        "to_status": to_status,
                        "action": action,
                        "origin": None,
                        "reason": "bulk",
                        "run_id": run_id,
                        "launch_path": None,
                        "at": at,
                        "worker": "bench:1",
                    },
                )
            yield (
                "provider_call",
                {
                    **key,
                    "step_id": step,
                    "run_id": run_id,
                    "kind": "text",
                    "units": 1,
                    "model": "offline",
                    "at": started,
                    "finished_at": ended,
                },
            )


def fill(url: str, first: int, last: int, steps: list[str]) -> None:
    """Insert episodes ``first`` to ``last - 1`` straight into the ledger's tables."""
    tables = {
        "step_run": step_run,
        "step_transition": step_transition,
        "provider_call": provider_call,
        "episode_calls": episode_calls,
    }
    batches: dict[str, list[dict[str, Any]]] = {name: [] for name in tables}
    engine = engine_for(url)

    def flush(name: str) -> None:
        rows = batches[name]
        if not rows:
            return
        columns = list(rows[0])
        if engine.dialect.name == "postgresql":  # COPY: a bulk load at the server's pace
            with engine.begin() as conn:
                cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
                with cursor.copy(f"COPY {name} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row([row[c] for c in columns])
        else:  # a bulk load without an fsync per batch
            with closing(sqlite3.connect(str(engine.url.database))) as conn:
                conn.execute("PRAGMA synchronous = OFF")
                places = ", ".join(f":{c}" for c in columns)
                conn.executemany(
                    f"INSERT INTO {name} ({', '.join(columns)}) VALUES ({places})", rows
                )
                conn.commit()
        batches[name] = []

    for name, row in _rows(first, last, steps):
        batches[name].append(row)
        if len(batches[name]) >= CHUNK:
            flush(name)
    for name in tables:
        flush(name)
    # The calls counted in their project's days, as recording them does.
    day = sa.func.substr(provider_call.c.at, 1, 10)
    with engine.begin() as conn:
        conn.execute(sa.delete(project_day_spend))
        conn.execute(
            sa.insert(project_day_spend).from_select(
                ["project_id", "day", "cost_micros", "calls", "priced"],
                sa.select(
                    provider_call.c.project_id, day, sa.literal(0), sa.func.count(), sa.literal(0)
                ).group_by(provider_call.c.project_id, day),
            )
        )
    if engine.dialect.name == "postgresql":  # the planner's statistics, as autovacuum keeps them
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for name in tables:
                conn.exec_driver_sql(f"ANALYZE {name}")
    else:  # and the bulk load's log folded into the file, as a checkpoint of the day would
        with closing(sqlite3.connect(str(engine.url.database))) as conn:
            conn.execute("ANALYZE")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


@dataclass
class Sent:
    """One statement the ledger's engine sent: its text, parameters and seconds."""

    text: str
    parameters: Any
    seconds: float

    def reads_ledger(self) -> bool:
        text = " ".join(self.text.split())
        return text.upper().startswith("SELECT") and any(
            f"FROM {table}" in text for table in LEDGER_TABLES
        )


@contextmanager
def counting(engine: sa.Engine) -> Iterator[list[Sent]]:
    """Every SQL statement ``engine`` (the ledger's) sends meanwhile; the Dagster
    instance's own statements are not the ledger's and are left out."""
    sent: list[Sent] = []
    began: list[float] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        began.append(time.perf_counter())

    def after(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        sent.append(Sent(statement, parameters, time.perf_counter() - began.pop()))

    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)
        sa.event.remove(engine, "after_cursor_execute", after)


def unfiltered_reads(sent: list[Sent]) -> list[str]:
    """Statements reading a ledger table with no episode in their WHERE clause (but the
    project's spend status shows beside the episode's: its rows per day, by project)."""
    return [
        " ".join(s.text.split())[:160]
        for s in sent
        if s.reads_ledger()
        and "episode_id" not in s.text.partition("WHERE")[2]
        and "FROM project_day_spend" not in s.text
    ]


def scans(engine: sa.Engine, sent: list[Sent]) -> list[str]:
    """The ledger reads whose plan scans a whole table (no index), each statement once.
    Meaningful on a large ledger only: a planner scans a table of a few pages on purpose."""
    found: dict[str, str] = {}
    explain = "EXPLAIN " if engine.dialect.name == "postgresql" else "EXPLAIN QUERY PLAN "
    with engine.connect() as conn:
        for s in sent:
            if not s.reads_ledger() or s.text in found:
                continue
            plan = " / ".join(
                " ".join(str(row[-1]).split())
                for row in conn.exec_driver_sql(explain + s.text, s.parameters)
            )
            scanned = [t for t in LEDGER_TABLES if f"Seq Scan on {t}" in plan]
            scanned += [t for t in LEDGER_TABLES if f"SCAN {t}" in plan and "USING" not in plan]
            if scanned:
                found[s.text] = f"{', '.join(scanned)}: {plan[:240]}"
    return list(found.values())


@dataclass
class Ledger:
    """One measured ledger: its size, its workspace, its figures."""

    episodes: int
    ws: Workspace
    seconds: list[float]
    sql_seconds: list[float]
    sent: list[Sent]
    problems: int = 0

    def once(self, partition: str) -> None:
        with counting(self.ws.ledger.engine) as sent:
            started = time.perf_counter()
            report = status_report(self.ws, (partition,))
            self.seconds.append(time.perf_counter() - started)
        assert report.totals["partitions"] == 1, report.totals
        self.sql_seconds.append(sum(s.seconds for s in sent))
        self.sent = sent


@contextmanager
def database(backend: str, args: argparse.Namespace, scratch: Path, label: str) -> Iterator[str]:
    """A fresh, migrated ledger of ``backend``; its URL."""
    if backend == "sqlite":
        url = f"sqlite:///{scratch / f'ledger-{label}.sqlite3'}"
        LedgerStore(url).migrate()
        yield url
        return
    name = f"{args.db_prefix}_{label}_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(args.pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
    try:
        LedgerStore(url).migrate()
        yield url
    finally:
        engine_for(url).dispose()
        if args.keep:
            print(f"  kept database {name}")
        else:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def run_backend(backend: str, args: argparse.Namespace, steps: list[str]) -> list[Ledger]:
    """Two ledgers (``--small`` and ``--episodes`` episodes), status of the same partition
    of each, alternating (a load change on the machine falls on both alike)."""
    with tempfile.TemporaryDirectory(prefix="status-scale-") as tmp, ExitStack() as stack:
        scratch = Path(tmp)
        dagster_home = scratch / "dagster"
        dagster_home.mkdir()
        (dagster_home / "dagster.yaml").write_text("")
        os.environ["DAGSTER_HOME"] = str(dagster_home)
        defs = load_definitions()
        partition = f"{PROJECT}/{episode_id(args.small // 2)}"
        ledgers = []
        for size in (args.small, args.episodes):
            url = stack.enter_context(database(backend, args, scratch, str(size)))
            started = time.perf_counter()
            fill(url, 0, size, steps)
            print(
                f"  {backend}: {size} episodes ({size * len(steps)} step rows) filled in "
                f"{time.perf_counter() - started:.1f} s",
                flush=True,
            )
            pipeline = PipelineResource(home=str(scratch / "home"), db_url=url)
            ws = Workspace(defs=defs, steps=steps_of(defs), pipeline=pipeline)
            status_report(ws, (partition,))  # warm-up: the engine's pool, settings
            ledgers.append(Ledger(size, ws, [], [], []))
        for _ in range(args.repeats):
            for ledger in ledgers:
                ledger.once(partition)
        for ledger in ledgers:
            engine = ledger.ws.ledger.engine
            print(
                f"  {backend}: {ledger.episodes} episodes: status of one partition "
                f"{statistics.median(ledger.seconds) * 1000:.1f} ms (median of {args.repeats}), "
                f"of which SQL {statistics.median(ledger.sql_seconds) * 1000:.1f} ms; "
                f"{len(ledger.sent)} ledger statements",
                flush=True,
            )
            for text in unfiltered_reads(ledger.sent):
                ledger.problems += 1
                print(f"    reads without an episode filter: {text}")
            for text in scans(engine, ledger.sent) if ledger.episodes == args.episodes else ():
                ledger.problems += 0 if args.smoke else 1
                print(f"    scans a table: {text}")
            if args.slowest:
                for s in sorted(ledger.sent, key=lambda s: -s.seconds)[:3]:
                    print(f"    {s.seconds * 1000:7.1f} ms  {' '.join(s.text.split())[:300]}")
        return ledgers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--episodes", type=int, default=10_000, help="episodes of the large ledger (10000)"
    )
    parser.add_argument("--small", type=int, default=100, help="episodes of the small ledger (100)")
    parser.add_argument("--repeats", type=int, default=7, help="timed status runs per size (7)")
    parser.add_argument(
        "--backends", default="sqlite,postgresql", help="ledgers measured (sqlite,postgresql)"
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("PIPELINE_BENCH_PG_URL") or os.environ.get("PIPELINE_TEST_PG_URL"),
        help="a PostgreSQL server database we may CREATE DATABASE from (default: "
        "PIPELINE_BENCH_PG_URL, else PIPELINE_TEST_PG_URL; none: postgresql is skipped)",
    )
    parser.add_argument(
        "--db-prefix", default="bench_status", help="name prefix of the databases it creates"
    )
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL database")
    parser.add_argument(
        "--slowest", action="store_true", help="print the three slowest statements per size"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a small size that runs in seconds (CI): 20 and 200 episodes, 1 repeat",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.small, args.episodes, args.repeats = 20, 200, 1
    if args.small >= args.episodes:
        parser.error("--small must be below --episodes")
    steps = [s.step_id for s in steps_of(load_definitions())]
    print(f"status of one partition, {len(steps)} steps per episode")
    failed = 0
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        if backend == "postgresql" and not args.pg_url:
            print("skipping postgresql: no --pg-url / PIPELINE_TEST_PG_URL", file=sys.stderr)
            continue
        small, large = run_backend(backend, args, steps)
        ratio = statistics.median(large.seconds) / statistics.median(small.seconds)
        sql = statistics.median(large.sql_seconds) / statistics.median(small.sql_seconds)
        print(
            f"{backend}: one partition at {large.episodes} vs {small.episodes} episodes: "
            f"{ratio:.2f}x the time (goal about 1x), {sql:.2f}x the time in SQL; "
            f"statements {len(small.sent)} -> {len(large.sent)}",
            flush=True,
        )
        failed += small.problems + large.problems
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
