"""Benchmark: an unsealed cold start of the resume sensor under a real ``dagster dev``.

What a migrated ledger looks like to the sensor: every (episode, step) has a completed row
and a valid checkpoint, but no row carries a seal, so the first judgement of each
partition reads, parses and verifies every envelope the long way. The production sensor
(``build_defs``: 30 s interval, 40 s tick budget, the daemon's own gRPC timeout) must get
through it across ticks without a sensor timeout and without launching anything twice.

The tree and the rows are ``benchmarks/sensor_tick.py``'s generator (one episode built the
real way, every other one a byte copy, rows loaded with ``COPY``), then every seal is
dropped from the ledger (``checkpoint_seal = NULL``) and one episode in ``--every`` loses
a picture (``scene_image_pipeline/shots/S01.png``): those, and only those, must be
launched, once each. Dagster's instance is in PostgreSQL with a run queue that starts
nothing (``max_concurrent_runs: 0``), so each launch stays queued: in flight, it holds its
episode back, as a slow run would.

Reported per tick (the sensor's ticks as Dagster stored them, read through GraphQL): the
tick's duration, its status, the runs it requested and the partitions it left for the next
tick (the cursor's ``pending``); then how many ticks and how long until a tick left nothing
over, and the runs per launched partition.

    .venv/bin/python benchmarks/sensor_convergence.py --episodes 100000 \\
        --pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test

Creates (and drops, unless ``--keep``) two databases on that server,
``<--db-prefix>_<n>`` (the ledger) and ``<--db-prefix>_dagster_<n>`` (Dagster's; the
prefix defaults to ``bench_converge``). At
100,000 episodes: ~8 min to generate 2.8 million files and 1,000,000 rows on a 2-core host,
~20 min of ticks, and ~10 min to delete the tree afterwards (the JSON result is printed
after that; the per-tick lines go to stderr as they come). Stop it with SIGINT, not
SIGKILL, so that ``dagster dev`` is stopped with it.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import dagster as dg  # noqa: E402
import sensor_tick  # noqa: E402
import sqlalchemy as sa  # noqa: E402
import yaml  # noqa: E402

from pipeline_defs.judging.cursor import CursorState  # noqa: E402
from pipeline_defs.wiring.assets import episodes as episodes_partitions  # noqa: E402
from resources.pipeline import PipelineResource  # noqa: E402
from sensors.resume_sensor import SENSOR_NAME, STEPS_JOB  # noqa: E402
from tests.support.dagster_dev import dagster_dev, graphql, write_workspace  # noqa: E402

LOCATION = "convergence"
TICKS_QUERY = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { ticks(limit: 500) {
      id status timestamp endTimestamp runIds cursor skipReason error { message } } } }
  }
}
"""


def _database(server_url: str, name: str) -> str:
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    return sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)


def _drop(server_url: str, name: str) -> None:
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def _dagster_home(path: Path, dagster_url: str) -> None:
    """Dagster's instance in PostgreSQL; a run queue that starts nothing."""
    config = {
        "storage": {"postgres": {"postgres_url": dagster_url}},
        "run_coordinator": {
            "module": "dagster.core.run_coordinator",
            "class": "QueuedRunCoordinator",
            "config": {"max_concurrent_runs": 0},
        },
        "telemetry": {"enabled": False},
        "nux": {"enabled": False},
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "dagster.yaml").write_text(yaml.safe_dump(config))


def _ticks(url: str) -> list[dict[str, Any]]:
    selector = {
        "repositoryLocationName": LOCATION,
        "repositoryName": "__repository__",
        "sensorName": SENSOR_NAME,
    }
    data = graphql(url, TICKS_QUERY, {"selector": selector})["sensorOrError"]
    if data["__typename"] != "Sensor":
        raise RuntimeError(f"sensor not found: {data}")
    ticks = [t for t in data["sensorState"]["ticks"] if t["status"] != "STARTED"]
    return sorted(ticks, key=lambda t: t["timestamp"])


# The sensor's own line per tick (its log, or the skip reason of a tick that requested
# nothing): mode, partitions judged, what is left, rows read.
TICK_LINE = re.compile(
    r"resume tick \[(?P<mode>\w+)\]: \d+ partitions(?:, (?P<judged>\d+) re-judged "
    r"\((?P<why>[^)]*)\), \d+ judge calls, (?P<left>\d+) left for the next tick "
    r"\((?P<unjudged>\d+) never judged\), (?P<queries>\d+) row queries \((?P<rows>\d+) rows\))?"
)


def _row(tick: dict[str, Any]) -> dict[str, Any]:
    state = CursorState.decode(tick["cursor"])
    return {
        "status": tick["status"],
        "seconds": round((tick["endTimestamp"] or tick["timestamp"]) - tick["timestamp"], 1),
        "runs": len(tick["runIds"] or []),
        "pending": None if state is None else state.pending,
        "note": (tick["error"] or {}).get("message", "")[:300] or (tick["skipReason"] or ""),
    }


def _tick_lines(log: Path) -> list[dict[str, Any]]:
    found = []
    for match in TICK_LINE.finditer(log.read_text(errors="replace")):
        line = {"mode": match["mode"]}
        if match["judged"] is not None:
            line |= {
                "judged": int(match["judged"]),
                "why": match["why"],
                "unjudged": int(match["unjudged"]),
                "row_queries": int(match["queries"]),
                "rows": int(match["rows"]),
            }
        found.append(line)
    return found


def run(
    episodes: int,
    server_url: str,
    every: int,
    timeout_s: float,
    keep: bool,
    prefix: str = "bench_converge",
) -> dict[str, Any]:
    ledger_db, dagster_db = f"{prefix}_{episodes}", f"{prefix}_dagster_{episodes}"
    ledger_url = _database(server_url, ledger_db)
    dagster_url = (
        sa.make_url(_database(server_url, dagster_db))
        .set(drivername="postgresql+psycopg2")
        .render_as_string(hide_password=False)
    )
    work = Path(tempfile.mkdtemp(prefix=f"bench-converge-{episodes}-"))
    home, dagster_home = work / "home", work / "dagster_home"
    home.mkdir()
    out: dict[str, Any] = {"episodes": episodes, "cpus": os.cpu_count()}
    try:
        pipeline = PipelineResource(home=str(home), db_url=ledger_url)
        ledger = pipeline.ledger()
        ledger.migrate()
        started = time.perf_counter()
        keys = sensor_tick.generate(home, ledger, episodes)
        with ledger.engine.begin() as conn:  # a ledger migrated from before seals
            conn.exec_driver_sql("UPDATE step_run SET checkpoint_seal = NULL")
        changed = keys[every // 2 :: every]
        for pk in changed:
            project, episode = pk.split("/")
            (
                home / "checkpoints" / project / episode / "scene_image_pipeline/shots/S01.png"
            ).unlink()
        out["generate_s"] = round(time.perf_counter() - started, 1)
        out["changed"] = len(changed)
        _dagster_home(dagster_home, dagster_url)
        with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
            instance.add_dynamic_partitions(str(episodes_partitions.name), keys)
        workspace = write_workspace(
            work / "workspace.yaml", "convergence_location", "defs", LOCATION, ROOT / "benchmarks"
        )
        env = {
            **os.environ,
            "DAGSTER_HOME": str(dagster_home),
            "PIPELINE_HOME": str(home),
            "PIPELINE_DB_URL": ledger_url,
        }
        rows: list[dict[str, Any]] = []
        with dagster_dev(workspace, env, ROOT, work / "dagster_dev.log") as (url, _process):
            deadline = time.monotonic() + timeout_s
            first_at: float | None = None
            while time.monotonic() < deadline:
                time.sleep(5)
                ticks = _ticks(url)
                for tick in ticks[len(rows) :]:
                    row = _row(tick)
                    rows.append(row)
                    first_at = first_at or tick["timestamp"]
                    row["since_first_s"] = round(tick["endTimestamp"] - first_at, 1)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                done = [i for i, r in enumerate(rows) if r["pending"] == 0]
                if done and len(rows) > done[0] + 1:  # converged, plus one tick after it
                    break
            # The sensor logs its line for every tick that judged something; an unchanged
            # tick's line is its skip reason.
            lines = _tick_lines(work / "dagster_dev.log")
            judged_lines = iter(lines)
            for row in rows:
                if "resume tick [unchanged]" in row["note"]:
                    row["tick"] = {"mode": "unchanged"}
                else:
                    row["tick"] = next(judged_lines, None)
            with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
                runs = instance.get_runs(dg.RunsFilter(job_name=STEPS_JOB))
                per_partition = Counter(r.tags.get("dagster/partition") for r in runs)
        out["ticks"] = rows
        # Every partition judged once (the cold start through), and nothing left at all (a
        # refresh that fell due meanwhile through as well: at 100,000 unsealed episodes the
        # cold start outlasts the 10-minute refresh).
        through = [
            i for i, r in enumerate(rows) if r.get("tick") and r["tick"].get("unjudged") == 0
        ]
        out["judged_once_after_ticks"] = through[0] + 1 if through else None
        out["judged_once_after_s"] = rows[through[0]]["since_first_s"] if through else None
        done = [i for i, r in enumerate(rows) if r["pending"] == 0]
        out["converged_after_ticks"] = done[0] + 1 if done else None
        out["converged_after_s"] = rows[done[0]]["since_first_s"] if done else None
        out["max_rows_per_tick"] = max(
            (r["tick"]["rows"] for r in rows if r.get("tick") and "rows" in r["tick"]), default=None
        )
        out["failed_ticks"] = sum(r["status"] == "FAILURE" for r in rows)
        out["max_tick_s"] = max((r["seconds"] for r in rows), default=None)
        out["runs"] = sum(per_partition.values())
        out["partitions_launched_twice"] = sorted(p for p, n in per_partition.items() if n > 1)
        out["launched_unchanged"] = sorted(p for p in per_partition if p not in set(changed))
        out["changed_not_launched"] = len(set(changed) - set(per_partition))
        return out
    finally:
        if keep:
            print(f"kept: {work}, databases {ledger_db}, {dagster_db}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
            from resources.ledger.store import engine_for

            engine_for(ledger_url).dispose()
            _drop(server_url, ledger_db)
            _drop(server_url, dagster_db)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--episodes", type=int, default=100_000, help="episodes registered (default 100000)"
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "PIPELINE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL server database we may CREATE DATABASE from",
    )
    parser.add_argument(
        "--every", type=int, default=1000, help="one episode in this many loses a picture"
    )
    parser.add_argument(
        "--timeout-minutes",
        type=float,
        default=45.0,
        help="give up when not converged by then (default 45)",
    )
    parser.add_argument(
        "--db-prefix",
        default="bench_converge",
        help="name prefix of its two databases: PREFIX_<n>, PREFIX_dagster_<n> "
        "(default bench_converge)",
    )
    parser.add_argument("--keep", action="store_true", help="keep databases and homes")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a small run (CI): 20 episodes, one in 10 changed, given up after 4 minutes "
        "(its length is the sensor's 30 s interval: two ticks at least)",
    )
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.every, args.timeout_minutes = 20, 10, 4.0
    result = run(
        args.episodes,
        args.pg_url,
        args.every,
        args.timeout_minutes * 60,
        args.keep,
        args.db_prefix,
    )
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
