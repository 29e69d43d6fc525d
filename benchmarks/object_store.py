"""Object storage: publishing a checkpoint, and what the resume sensor asks the bucket per tick.

1. **Publish** (``--parts publish``): what a bucket-backed image step does to publish
   (resources/checkpoints/bucket.py): its objects go under its own attempt prefix as
   create-only puts (``If-None-Match: *``), the envelope last, and one owner-aware ledger
   transition stores the manifest as the commit pointer. The baseline is the least any
   writer can do: plain puts of the same bytes (overwrite mode, no condition, no hashing, no
   ledger). Both run in the same process, in alternation, against the same moto S3 server on
   127.0.0.1, so the ratio holds on any machine even where absolute times do not. Target:
   ours <= 1.3 x the raw puts, ledger commit included.
2. **Scrub** (``--parts scrub``): one LIST per episode prefix compared with the manifests,
   the request that replaces per-file checks on a bucket (``scrub_episode``).
3. **Requests per sensor tick** (``--parts ticks``): ``--episodes`` episodes x 10 steps
   published on the bucket, judged by the real ``resume_sensor`` (``evaluate_tick`` with a
   Dagster test instance holding the partitions) in a fresh process with an empty scratch
   (a new sensor pod). One episode is run for real (the ten storyboard steps, offline
   models, its inputs published first so every row carries an object seal); every other
   one is a replica: its objects copied to the episode's own prefix (the envelope's
   ``episode_id`` rewritten; artifacts byte for byte) and its rows copied with the
   manifests naming the new keys and e_tags and the seals naming the new story's e_tag and
   the new victims' pointers. The fixture is loaded straight into moto's in-process backend
   (like a ``COPY`` into the ledger); every request measured goes over HTTP. The sensor
   process counts every object-store request by kind, the scrub's apart from everything
   else, and names the call site of every request outside the scrub. Time is simulated:
   ticks ``--interval`` seconds apart (the shipped 30 s) on the sensor's clock and the
   scrub's, and each tick starts past ``INPUTS_MAX_AGE_SECONDS`` (the process's input
   copies are as old as they would be 30 s later). Ticks: cold; warm, nothing changed; then
   1 % of the episodes changed by another machine (half lost a PNG in the bucket, the rest a
   failed ledger row, a story replaced as ``add-episode --replace`` does, a story
   overwritten in the bucket behind the ledger's back), ticked until every change is seen
   (at most one scrub period); the launched runs are not executed, so the changed
   partitions stay changed. ``--config-edit`` then replaces ``project.yaml`` in the
   bucket and ticks until the sensor reads it.

    .venv/bin/python benchmarks/object_store.py --rounds 20 --episodes 1000 --config-edit \
        --db-url postgresql+psycopg://postgres@127.0.0.1:5432/test

About 6 minutes on a loaded 2-core host, most of it the scrub's ~2,000 LISTs of a full
period against moto (which scans every key of the bucket for each LIST).

The publish part's ledger is the URL given (a throwaway table set is created in it through
the store's migrations) or a temporary SQLite file; the tick part creates (and drops) a
database of its own on that PostgreSQL server (``<--db-prefix>_<pid>``, by default
``bench_object_store_<pid>``), or uses a temporary SQLite file. ``--smoke`` is a run of
seconds (5 episodes, 2 rounds, one warm tick, a scrub period of 60 s).
"""

import argparse
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/object_store.py` from anywhere
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import dagster as dg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
import yaml  # noqa: E402
from object_store_fixture import (  # noqa: E402
    BUDGET,
    FULL_REFRESH,
    PROJECT,
    Clock,
    Recording,
    apply_changes,
    build_fixture,
    choose_changes,
)
from object_store_publish import bench_publish, bench_scrub  # noqa: E402
from object_store_report import report_ticks  # noqa: E402
from s3_server import SECRET, S3Server, running_s3_server  # noqa: E402

from pipeline_defs.definitions import build_resources  # noqa: E402
from pipeline_defs.judging.registry import ticker_for  # noqa: E402
from pipeline_defs.judging.scrub import scrub_for  # noqa: E402
from pipeline_defs.judging.stores import Stores  # noqa: E402
from pipeline_defs.judging.tick_result import TickConfig  # noqa: E402
from pipeline_defs.storyboard import STORYBOARD_STEPS  # noqa: E402
from pipeline_defs.wiring.assets import build_step_assets  # noqa: E402
from resources.checkpoints.published import scratch_cache_of  # noqa: E402
from resources.ledger.store import engine_for  # noqa: E402
from resources.pipeline import PipelineResource  # noqa: E402
from resources.storage import open_storage  # noqa: E402
from sensors.report import REPORT_JOB, reported  # noqa: E402
from sensors.resume_sensor import SENSOR_NAME, build_resume_sensor  # noqa: E402


def sensor_process(spec: dict[str, Any]) -> dict[str, Any]:
    """The measurement, in a fresh process with an empty scratch: a new sensor pod."""
    home = Path(tempfile.mkdtemp(prefix="bench-os-sensor-"))
    other_home = Path(tempfile.mkdtemp(prefix="bench-os-other-"))
    try:
        return _ticks(spec, home, other_home)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(other_home, ignore_errors=True)


def _ticks(spec: dict[str, Any], home: Path, other_home: Path) -> dict[str, Any]:
    pipeline = PipelineResource(
        home=str(home), db_url=spec["db_url"], storage_url=spec["storage_url"]
    )
    store = pipeline.checkpoints()
    cache = scratch_cache_of(store)
    assert cache is not None
    recorder = Recording(cache.storage)
    cache.bucket.storage = recorder
    interval = float(spec["interval"])
    period = pipeline.settings().scrub_period_seconds
    clock = Clock(time.monotonic(), datetime.now(UTC))
    sensor = build_resume_sensor(
        STORYBOARD_STEPS,
        clock=clock.now,
        full_refresh_seconds=FULL_REFRESH,
        tick_budget_seconds=BUDGET,
    )
    scrub_for(SENSOR_NAME).clock = clock.monotonic
    config = TickConfig(FULL_REFRESH, budget_seconds=BUDGET, workers=None, trust_seals=True)
    defs = dg.Definitions(
        assets=build_step_assets(STORYBOARD_STEPS),
        sensors=[sensor],
        resources=build_resources(pipeline),
    )
    partitions: list[str] = spec["partitions"]
    steps = len(STORYBOARD_STEPS)
    out: dict[str, Any] = {
        "episodes": len(partitions),
        "steps": steps,
        "interval": interval,
        "scrub_period": period,
        "ticks": [],
        "sites": {},
    }
    changes = choose_changes(partitions)
    out["changes"] = changes
    detected: dict[str, dict[str, Any]] = {}
    cursor: list[str | None] = [None]

    def tick(phase: str) -> dict[str, Any]:
        if out["ticks"]:
            clock.advance(interval)
        # The ticks are `interval` apart: the process's copy of each project's config is
        # older than INPUTS_MAX_AGE_SECONDS at the start of each (5 s < 30 s).
        cache.inputs.synced.clear()
        recorder.reset()
        context = dg.build_sensor_context(
            instance=instance, cursor=cursor[0], definitions=defs, resources={"pipeline": pipeline}
        )
        started = time.perf_counter()
        with dg.partition_loading_context(dynamic_partitions_store=instance):
            result = sensor.evaluate_tick(context)
        wall = time.perf_counter() - started
        cursor[0] = result.cursor
        stats = ticker_for(SENSOR_NAME, STORYBOARD_STEPS, Stores.of(pipeline), config).last_stats
        assert stats is not None
        requests = result.run_requests or []
        launched = {
            r.partition_key: [a.to_user_string() for a in r.asset_selection or ()]
            for r in requests
            if r.job_name != REPORT_JOB and r.partition_key
        }
        blocks = [(c.partition, c.step_id) for c in reported(requests) if not c.passed]
        record = {
            "n": len(out["ticks"]),
            "phase": phase,
            "mode": stats.mode,
            "rejudged": stats.evaluated_partitions,
            "wall": round(wall, 3),
            "engine": round(stats.seconds, 3),
            "scrub": recorder.share("scrub"),
            "other": recorder.share("other"),
            "launches": len(launched),
            "blocks": len(blocks),
            "why": dict(stats.changed),  # why partitions were re-judged
            "run_keys": {  # of the changed partitions: a new key is a new run for Dagster
                r.partition_key: r.run_key
                for r in requests
                if r.job_name != REPORT_JOB and r.partition_key in changes
            },
            "request_seconds": {k: round(v, 3) for k, v in recorder.seconds.items()},
        }
        if phase == "changed":
            since = sum(1 for t in out["ticks"] if t["phase"] == "changed") + 1
            seen = {pk: f"launch {','.join(s)}" for pk, s in launched.items()}
            for pk, step_id in blocks:
                seen.setdefault(pk, f"block {step_id}")
            for pk, what in seen.items():
                if pk in changes and pk not in detected:
                    detected[pk] = {"kind": changes[pk], "tick": since, "what": what}
            record["detected"] = len(detected)
        for site, count in recorder.sites.items():
            sites = out["sites"].setdefault(f"{phase}/{stats.mode}", {})
            sites[site] = sites.get(site, 0) + count
        out["ticks"].append(record)
        return record

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("episodes", partitions)
        cold = tick("cold")
        if cold["launches"] or cold["blocks"]:
            out["warning"] = "the cold tick launched or blocked: the replicas are not clean"
        for _ in range(spec["warm_ticks"]):
            tick("warm")
        apply_changes(changes, pipeline, other_home)
        limit = math.ceil(period / interval) + 2
        while len(detected) < len(changes) and limit > 0:
            tick("changed")
            limit -= 1
        for _ in range(2):
            tick("after")
        if spec.get("config_edit"):
            limit = math.ceil(FULL_REFRESH / interval) + 2
            out["config_edit"] = edit_config(spec["storage_url"], other_home, tick, limit)
    out["detected"] = detected
    return out


def edit_config(
    storage_url: str, home: Path, tick: Callable[[str], dict[str, Any]], limit: int
) -> dict[str, Any]:
    """``project.yaml`` replaced in the bucket by another machine (``image.width`` +32):
    ticks until the sensor reads it (a GET of it) and acts on it (launches or blocks)."""
    storage = open_storage(storage_url, home=home)
    key = f"projects/{PROJECT}/project.yaml"
    found = storage.head(key)
    assert found is not None
    config = yaml.safe_load(storage.get(key))
    config["image"]["width"] += 32
    storage.put_if_match(key, yaml.safe_dump(config, sort_keys=True).encode("utf-8"), found)
    out: dict[str, Any] = {}
    for n in range(1, limit + 1):
        t = tick("config")
        if t["other"].get("get") and "read" not in out:
            out["read"] = n
        if t["launches"] or t["blocks"]:
            out.update(acted=n, mode=t["mode"], launches=t["launches"], blocks=t["blocks"])
            break
    return out


def bench_ticks(server: S3Server, db_url: str | None, args: argparse.Namespace) -> None:
    made: str | None = None
    scratch = tempfile.mkdtemp(prefix="bench-os-ticks-")
    if db_url is not None and db_url.startswith("postgresql"):
        made = f"{args.db_prefix}_{os.getpid()}"
        admin = sa.create_engine(db_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{made}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{made}"')
        admin.dispose()
        url = sa.make_url(db_url).set(database=made).render_as_string(hide_password=False)
    else:
        url = f"sqlite:///{scratch}/ledger.sqlite3"
    try:
        fixture = build_fixture(server, url, args.episodes)
        spec = {
            **fixture,
            "interval": args.interval,
            "warm_ticks": args.warm_ticks,
            "config_edit": args.config_edit,
        }
        spec_file = Path(scratch) / "spec.json"
        spec_file.write_text(json.dumps(spec))
        env = dict(os.environ)
        env.pop("PIPELINE_SCRUB_PERIOD_SECONDS", None)
        if args.scrub_period is not None:
            env["PIPELINE_SCRUB_PERIOD_SECONDS"] = str(args.scrub_period)
        log = Path(scratch) / "sensor.log"
        with log.open("wb") as stderr:
            child = subprocess.run(
                [sys.executable, __file__, "--sensor-process", str(spec_file)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=stderr,
                check=False,
            )
        if child.returncode != 0:
            sys.stderr.write(log.read_text()[-20_000:])
            raise SystemExit(f"the sensor process failed ({child.returncode})")
        result = json.loads(child.stdout.decode().strip().splitlines()[-1])
        report_ticks(result, fixture)
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {"fixture": {**fixture, "partitions": len(fixture["partitions"])}, **result},
                    indent=1,
                )
            )
    finally:
        if made is not None and db_url is not None:
            engine_for(url).dispose()
            admin = sa.create_engine(db_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{made}" WITH (FORCE)')
            admin.dispose()
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--parts",
        default="publish,scrub,ticks",
        help="what to measure, comma separated (default publish,scrub,ticks)",
    )
    parser.add_argument(
        "--rounds", type=int, default=30, help="publishes timed per storage (default 30)"
    )
    parser.add_argument("--episodes", type=int, default=1000, help="episodes (scrub, ticks)")
    parser.add_argument(
        "--db-url", default=None, help="ledger URL (default: a SQLite file of its own)"
    )
    parser.add_argument(
        "--db-prefix",
        default="bench_object_store",
        help="name prefix of the tick part's PostgreSQL database: PREFIX_<pid> "
        "(default bench_object_store)",
    )
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between ticks")
    parser.add_argument(
        "--warm-ticks", type=int, default=5, help="unchanged ticks timed after the first"
    )
    parser.add_argument(
        "--scrub-period",
        type=float,
        default=None,
        help="PIPELINE_SCRUB_PERIOD_SECONDS of the sensor (unset: the setting's default)",
    )
    parser.add_argument(
        "--config-edit",
        action="store_true",
        help="then replace project.yaml in the bucket: ticks until the sensor sees it",
    )
    parser.add_argument("--json", default=None, help="also write the tick results here")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a run of seconds (CI): 5 episodes, 2 rounds, one warm tick, scrub period 60 s",
    )
    parser.add_argument("--sensor-process", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.rounds, args.warm_ticks, args.scrub_period = 5, 2, 1, 60.0
    if args.sensor_process:  # the child: measure, print one JSON line
        spec = json.loads(Path(args.sensor_process).read_text())
        print(json.dumps(sensor_process(spec)))
        return
    parts = set(args.parts.split(","))
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
    with running_s3_server() as server, tempfile.TemporaryDirectory() as scratch:
        os.environ.update(server.env(SECRET))
        if "publish" in parts:
            bench_publish(server, args.rounds, args.db_url, scratch)
        if "scrub" in parts:
            bench_scrub(server, args.episodes, scratch)
        if "ticks" in parts:
            bench_ticks(server, args.db_url, args)


if __name__ == "__main__":
    main()
