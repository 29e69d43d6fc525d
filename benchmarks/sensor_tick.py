"""Benchmark: one resume-sensor tick on PostgreSQL at 1,000 / 10,000 / 30,000 episodes x 10 steps
(``--sizes 100000`` on request), each tick reported as a multiple of the physical floor.

Synthetic state: every (episode, step) has a completed ledger row, a valid checkpoint
envelope (three image steps also carry a small PNG artifact each, two of them in a
sub-directory) and an episode input file, and every row carries the seal its run would
have written, so the judge reaches table row 10 everywhere. The steps are ten trivial
stand-ins with the real step ids and dependency graph of
docs/DESIGN.md#reference-pipeline. One episode is built the real way (``Checkpoint``
envelopes, ``CheckpointStore.seal`` with the run protocol's ``verifier_reads``); every
other one is a byte copy with its own ids and timestamps, sealed with its own stat
identities, and the rows are loaded with one ``COPY``.

The floor: a bare ``lstat`` of every entry of the generated tree (``scandir`` walk of the
checkpoints and inputs), measured right before every tick (floor, cold, floor, warm, ...).
Each tick is printed as a multiple of it (wall and CPU; and against the run's median floor).

Before every floor and every tick the benchmark settles its heap (``gc.collect()``, measured
apart): generating the tree leaves a full collection due, which would otherwise fall inside
the cold tick. Each size runs in a fresh child process (empty envelope cache, no sensor
memory) and measures, through the real sensor (``evaluate_tick`` with a Dagster test
instance holding the ``episodes`` partitions; Dagster's own partition listing is also timed
apart):

- cold: first tick (judges everything: one row query, every seal checked by ``stat``);
- warm: the next tick with nothing changed (cursor: two aggregate reads + stats);
- 1 %: a tick after 1 % of the partitions changed (half lost a PNG, half got a failed
  ledger row): only those are re-judged, one re-run launched for each;
- full: a forced full re-judgement (the periodic safety net);
- cold without seals (``--skip-unsealed`` leaves it out): a second sensor with
  ``trust_seals=False`` (every envelope read, parsed and verified), i.e. what rows without
  a seal cost.

    .venv/bin/python benchmarks/sensor_tick.py --pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test

Each size creates (and drops) its own database ``<--db-prefix>_<n>`` (``bench_sensor_<n>``)
on that server; ``--smoke`` is a run of seconds (20 episodes, no unsealed tick).
``SENSOR_TICK_PROFILE=file`` writes a cProfile of the cold tick (``SENSOR_TICK_PROFILE_TICK``
names another: warm, one_percent, full). The sensor context carries the instance's ref, as
the daemon's does, so Dagster resolves the run requests the way it does in production.
"""

import argparse
import cProfile
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dagster as dg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from sensor_tick_fixture import STEPS, change_one_percent, floor_walk, generate  # noqa: E402

from pipeline_defs.definitions import build_resources  # noqa: E402
from pipeline_defs.judging.parallel import default_workers  # noqa: E402
from pipeline_defs.judging.registry import ticker_for  # noqa: E402
from pipeline_defs.judging.tick_result import TickConfig  # noqa: E402
from pipeline_defs.wiring.assets import build_step_assets  # noqa: E402
from resources.pipeline import PipelineResource  # noqa: E402
from sensors.report import REPORT_JOB, reported  # noqa: E402
from sensors.resume_sensor import build_resume_sensor  # noqa: E402

FULL_REFRESH = 600.0
BUDGET = 3600.0


# ----------------------------------------------------------------------------- one size
def run_size(
    episodes: int,
    server_url: str,
    keep: bool,
    workers: int | None,
    unsealed_tick: bool = True,
    prefix: str = "bench_sensor",
) -> dict[str, Any]:
    name = f"{prefix}_{episodes}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)
    home = Path(tempfile.mkdtemp(prefix=f"bench-sensor-{episodes}-"))
    try:
        pipeline = PipelineResource(home=str(home), db_url=url)
        ledger = pipeline.ledger()
        ledger.migrate()
        started = time.perf_counter()
        keys = generate(home, ledger, episodes)
        generated = time.perf_counter() - started
        now = [datetime.now(UTC)]
        sensor = build_resume_sensor(
            STEPS,
            clock=lambda: now[0],
            full_refresh_seconds=FULL_REFRESH,
            tick_budget_seconds=BUDGET,  # measure a whole cold tick, not a budgeted one
            workers=workers,
        )
        # The same sensor judging every envelope the long way (as for rows without seals,
        # e.g. a ledger migrated from before seals, or adopted checkpoints).
        unsealed = build_resume_sensor(
            STEPS,
            name="resume_sensor_unsealed",
            clock=lambda: now[0],
            full_refresh_seconds=FULL_REFRESH,
            tick_budget_seconds=BUDGET,
            workers=workers,
            trust_seals=False,
        )
        defs = dg.Definitions(
            assets=build_step_assets(STEPS),
            sensors=[sensor, unsealed],
            resources=build_resources(pipeline),
        )
        out: dict[str, Any] = {
            "episodes": episodes,
            "generate_s": round(generated, 1),
            "cpus": os.cpu_count(),
            "workers": workers or default_workers(),
            "load_before": round(os.getloadavg()[0], 1),
        }
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions("episodes", keys)
            # A daemon's instance has long been connected when its sensor ticks: the first
            # run-storage query of a fresh instance (engine, SQLAlchemy event listeners:
            # 0.1-0.3 s, once per process) is Dagster's start-up, measured apart, not the
            # cold tick's.
            t_warm = time.perf_counter()
            instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]), limit=1)
            out["instance_warm_up_seconds"] = round(time.perf_counter() - t_warm, 4)
            cursor: list[str | None] = [None]

            def tick(label: str, which: dg.SensorDefinition = sensor) -> None:
                # A settled heap before each measurement. Generating the tree and the rows
                # leaves this process a full (generation 2) collection due, and the first
                # allocation-heavy code pays it: it fell inside the cold tick, on Dagster's
                # partition listing (0.14 s CPU of a 0.62 s cold tick at 1,000, seen with
                # gc.callbacks). That is the generator's debt, not the tick's; a daemon's
                # code server has no such backlog. Measured apart (``settle_gc_seconds``).
                t_gc = time.process_time()
                gc.collect()
                out.setdefault("settle_gc_seconds", {})[label] = round(
                    time.process_time() - t_gc, 4
                )
                # The floor right before each tick (same caches, same load): floor, cold,
                # floor, warm, ...; every tick is reported as a multiple of it.
                floor_s, floor_cpu, entries = floor_walk(home)
                out.setdefault("floor", []).append(
                    {
                        "before": label,
                        "seconds": round(floor_s, 4),
                        "cpu_seconds": round(floor_cpu, 4),
                    }
                )
                out["entries"] = entries
                t_list = time.perf_counter()
                instance.get_dynamic_partitions("episodes")
                listing = time.perf_counter() - t_list
                context = dg.build_sensor_context(
                    instance=instance,
                    # As the daemon builds it: with the instance's ref, Dagster resolves the
                    # run requests' partitions through its per-evaluation loader.
                    instance_ref=instance.get_ref(),
                    cursor=cursor[0] if which is sensor else None,
                    definitions=defs,
                    resources={"pipeline": pipeline},
                )
                # SENSOR_TICK_PROFILE=file: a cProfile of the cold tick (or of the tick named by
                # SENSOR_TICK_PROFILE_TICK: warm, one_percent, full); it slows that tick ~2x.
                profiled = os.environ.get("SENSOR_TICK_PROFILE_TICK", "cold")
                profile_to = os.environ.get("SENSOR_TICK_PROFILE") if label == profiled else None
                # A file ending in .txt: a sampling profile (pyinstrument, if installed: less
                # distortion of call-heavy code than cProfile) as text instead.
                sampling = bool(profile_to and profile_to.endswith(".txt"))
                profiler: Any = None
                if profile_to:
                    if sampling:
                        from pyinstrument import Profiler

                        profiler = Profiler(interval=0.0005)
                    else:
                        profiler = cProfile.Profile()
                t0, c0 = time.perf_counter(), time.process_time()
                with dg.partition_loading_context(dynamic_partitions_store=instance):
                    if profiler is not None:
                        profiler.start() if sampling else profiler.enable()
                    result = which.evaluate_tick(context)
                    if profiler is not None:
                        profiler.stop() if sampling else profiler.disable()
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                if profiler is not None and profile_to:
                    if sampling:
                        Path(profile_to).write_text(profiler.output_text(show_all=False))
                    else:
                        profiler.dump_stats(profile_to)
                out.setdefault("load_during", []).append(round(os.getloadavg()[0], 1))
                if which is sensor:
                    cursor[0] = result.cursor
                config = TickConfig(
                    FULL_REFRESH,
                    budget_seconds=BUDGET,
                    workers=workers,
                    trust_seals=which is sensor,
                )
                ticker = ticker_for(which.name, STEPS, pipeline_stores(pipeline), config)
                stats = ticker.last_stats
                assert stats is not None
                out[label] = {
                    "seconds": round(seconds, 3),
                    "cpu_seconds": round(cpu, 3),  # this process only (not judge workers)
                    "sensor_seconds": round(stats.seconds, 3),  # inside the tick engine
                    "judged": stats.judged,
                    "partitions_judged": stats.evaluated_partitions,
                    "row_queries": stats.row_queries,
                    "rows": stats.rows_fetched,
                    "launches": len(
                        [r for r in result.run_requests or [] if r.job_name != REPORT_JOB]
                    ),
                    "blocks": len(reported(result.run_requests or [])),
                    "cursor_bytes": len(result.cursor or ""),
                    "floor_seconds": round(floor_s, 4),
                    "x_floor": round(seconds / floor_s, 2),
                    "cpu_x_floor": round(cpu / floor_cpu, 2),  # CPU over the floor's CPU
                    "engine_x_floor": round(stats.seconds / floor_s, 2),
                    "partition_listing_seconds": round(listing, 4),  # Dagster's, measured apart
                    "cpu_us_per_step_partition": round(cpu / (episodes * len(STEPS)) * 1e6, 2),
                }

            tick("cold")
            tick("warm")
            out["changed"] = change_one_percent(home, ledger, keys)
            tick("one_percent")
            tick("warm_after")
            now[0] += timedelta(seconds=FULL_REFRESH + 1)
            tick("full")
            if unsealed_tick:
                tick("cold_unsealed", unsealed)
        # Ratios against the median of all the floors of this run as well (the floor right
        # before a tick moves with the host's load as much as the tick does).
        floors = sorted(f["seconds"] for f in out["floor"])
        cpu_floors = sorted(f["cpu_seconds"] for f in out["floor"])
        out["floor_median"] = floors[len(floors) // 2]
        out["floor_cpu_median"] = cpu_floors[len(cpu_floors) // 2]
        for kind in ("cold", "warm", "one_percent", "warm_after", "full", "cold_unsealed"):
            if kind in out:
                t = out[kind]
                t["x_floor_median"] = round(t["seconds"] / out["floor_median"], 2)
                t["cpu_x_floor_median"] = round(t["cpu_seconds"] / out["floor_cpu_median"], 2)
        return out
    finally:
        if not keep:
            shutil.rmtree(home, ignore_errors=True)
            from resources.ledger.store import engine_for

            engine_for(url).dispose()
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def pipeline_stores(pipeline: PipelineResource) -> Any:
    from pipeline_defs.judging.stores import Stores

    return Stores.of(pipeline)


# ----------------------------------------------------------------------------- driver
KINDS = ("cold", "warm", "one_percent", "full", "cold_unsealed")


def table(results: list[dict[str, Any]]) -> str:
    """Wall time (CPU of the sensor process), and the wall time as a multiple of the floor
    (the bare ``lstat`` walk of the same tree, measured right before the tick), then the
    tick's CPU time as a multiple of the floor's CPU time."""

    def cell(r: dict[str, Any], kind: str) -> str:
        t = r[kind]
        if t["seconds"] < 1:
            took = f"{t['seconds'] * 1000:.0f} ms ({t['cpu_seconds'] * 1000:.0f} ms CPU)"
        else:
            took = f"{t['seconds']:.2f} s ({t['cpu_seconds']:.2f} s CPU)"
        return (
            f"{took} = **{t['x_floor']:.2f}x** ({t['cpu_x_floor']:.2f}x CPU; vs the median "
            f"floor {t['x_floor_median']:.2f}x / {t['cpu_x_floor_median']:.2f}x CPU)"
        )

    head = (
        "| episodes x steps | floor (lstat walk: entries, median) | cold tick | warm, no change | "
        "after 1 % changed | full re-judge | cold without seals | cold CPU per "
        "(step, partition) | load avg (before / max) |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        floors = sorted(f["seconds"] for f in r["floor"])
        median = floors[len(floors) // 2]
        lines.append(
            f"| {r['episodes']:,} x 10 | {r['entries']:,} entries, {median * 1000:.0f} ms | "
            + " | ".join(cell(r, k) if k in r else "-" for k in KINDS)
            + f" | {r['cold']['cpu_us_per_step_partition']:.1f} µs"
            f" | {r['load_before']} / {max(r['load_during'])} |"
        )
    one = results[-1]["one_percent"]
    lines.append("")
    lines.append(
        f"1 % tick at {results[-1]['episodes']:,}: {one['partitions_judged']} partitions "
        f"({one['judged']} judge calls), {one['row_queries']} row query ({one['rows']} rows), "
        f"{one['launches']} launches; warm {results[-1]['warm']['seconds'] * 1000:.0f} ms."
    )
    if len(results) > 1:
        first, last = results[0], results[-1]
        ratio = (
            last["cold"]["cpu_us_per_step_partition"] / first["cold"]["cpu_us_per_step_partition"]
        )
        lines.append(
            f"Linearity: cold CPU per (step, partition) at {last['episodes']:,} is "
            f"{ratio:.2f}x that at {first['episodes']:,}."
        )
    lines.append(
        "Dagster's partition listing, measured apart: "
        + ", ".join(
            f"{r['episodes']:,}: {r['cold']['partition_listing_seconds'] * 1000:.0f} ms"
            for r in results
        )
    )
    lines.append(
        "Settling the heap before the cold tick (a full collection, measured apart): "
        + ", ".join(
            f"{r['episodes']:,}: {r['settle_gc_seconds']['cold'] * 1000:.0f} ms CPU"
            for r in results
        )
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", default="1000,10000,30000", help="episodes per run, e.g. 100000 on request"
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "PIPELINE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL server database we may CREATE DATABASE from",
    )
    parser.add_argument(
        "--db-prefix",
        default="bench_sensor",
        help="name prefix of the databases it creates: PREFIX_<episodes> (default bench_sensor)",
    )
    parser.add_argument("--keep", action="store_true", help="keep databases and homes")
    parser.add_argument(
        "--workers", type=int, default=None, help="judge processes (default: one per CPU)"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--skip-unsealed",
        action="store_true",
        help="leave out the cold tick without seals (the slowest, ~17x the sealed one)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a run of seconds (CI): 20 episodes, no cold tick without seals",
    )
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.skip_unsealed = "20", True
    if args.one:
        result = run_size(
            args.one, args.pg_url, args.keep, args.workers, not args.skip_unsealed, args.db_prefix
        )
        print(json.dumps(result))
        return
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="bench-dagster-") as dagster_home:
            child = subprocess.run(
                [sys.executable, __file__, "--one", str(size), "--pg-url", args.pg_url]
                + ["--db-prefix", args.db_prefix]
                + (["--keep"] if args.keep else [])
                + (["--workers", str(args.workers)] if args.workers else [])
                + (["--skip-unsealed"] if args.skip_unsealed else []),
                capture_output=True,
                text=True,
                env={**os.environ, "DAGSTER_HOME": dagster_home},
            )
        if child.returncode != 0:
            sys.exit(child.stderr[-4000:])
        result = json.loads(child.stdout.strip().splitlines()[-1])
        results.append(result)
        print(json.dumps(result), file=sys.stderr)
    print(json.dumps(results, indent=1) if args.json else table(results))


if __name__ == "__main__":
    main()
