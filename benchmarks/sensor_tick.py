"""Benchmark: one resume-sensor tick on PostgreSQL at 100 / 1,000 / 10,000 episodes x 10 steps.

Synthetic state: every (episode, step) has a completed ledger row, a valid checkpoint
envelope (three image steps also carry a small PNG artifact each, one of them in a
sub-directory) and an episode input file, and every row carries the seal its run would
have written (``CheckpointStore.seal`` with the run protocol's ``verifier_reads``), so the
judge reaches table row 10 everywhere. The steps are ten trivial stand-ins with the real
step ids and dependency graph of SPEC §8.

Each size runs in a fresh child process (empty envelope cache, no sensor memory) and
measures, through the real sensor (``evaluate_tick`` with a Dagster test instance holding
the ``episodes`` partitions):

- cold: first tick (judges everything: one row query, every seal checked by ``stat``);
- warm: the next tick with nothing changed (cursor: two aggregate reads + stats);
- 1 %: a tick after 1 % of the partitions changed (half lost a PNG, half got a failed
  ledger row): only those are re-judged, one re-run launched for each;
- full: a forced full re-judgement (the periodic safety net);
- cold without seals: a second sensor with ``trust_seals=False`` (every envelope read,
  parsed and verified: artifact sha256, ``validate_data``, ``verify_completion``), i.e.
  what rows without a seal cost.

    .venv/bin/python benchmarks/sensor_tick.py --pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test

Each size creates (and drops) its own database ``bench_sensor_<n>`` on that server.
"""

import argparse
import cProfile
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dagster as dg  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from pipeline_defs.definitions import build_resources  # noqa: E402
from pipeline_defs.judging.parallel import default_workers  # noqa: E402
from pipeline_defs.judging.tick import TickConfig, ticker_for  # noqa: E402
from pipeline_defs.project import ProjectConfig, scoped_fingerprints  # noqa: E402
from pipeline_defs.resume.clock import format_timestamp  # noqa: E402
from pipeline_defs.resume.completion import CompletionReport, Origin  # noqa: E402
from pipeline_defs.resume.decision import config_hash  # noqa: E402
from pipeline_defs.resume.errors import PipelineError  # noqa: E402
from pipeline_defs.resume.partition import StepKey  # noqa: E402
from pipeline_defs.resume.settings import ResumeSettings  # noqa: E402
from pipeline_defs.steps.assets import build_step_assets  # noqa: E402
from pipeline_defs.steps.context import StepContext  # noqa: E402
from pipeline_defs.steps.graph import StepGraph  # noqa: E402
from pipeline_defs.steps.judge import StepJudge  # noqa: E402
from pipeline_defs.steps.spec import Step  # noqa: E402
from resources.checkpoints.envelope import Artifact, Checkpoint, mask_secrets  # noqa: E402
from resources.checkpoints.store import CheckpointStore  # noqa: E402
from resources.ledger.store import LedgerStore  # noqa: E402
from resources.ledger.tables import step_run  # noqa: E402
from resources.pipeline import PipelineResource  # noqa: E402
from sensors.report import REPORT_JOB, reported  # noqa: E402
from sensors.resume_sensor import build_resume_sensor  # noqa: E402

FULL_REFRESH = 600.0
BUDGET = 3600.0
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8  # 2 KiB stand-in image


class BenchStep(Step):
    """A trivial step: data ``{"items": [...]}``; verify checks the item count."""

    image: str | None = None

    def validate_data(self, data: Mapping[str, Any], *, source: str) -> None:
        if not isinstance(data.get("items"), list):
            raise PipelineError("io.integrity_violation", f"{source}: items missing")

    def verify_completion(self, ctx: StepContext, checkpoint: Checkpoint) -> CompletionReport:
        items = checkpoint.data.get("items") or []
        if len(items) != checkpoint.data.get("count"):
            return CompletionReport.incomplete(Origin.INVARIANT_DRIFT, ("item count",))
        return CompletionReport.clean()


def _step(step_id: str, deps: tuple[str, ...], image: str | None = None, **extra: Any) -> Step:
    cls = type(
        step_id.title().replace("_", ""),
        (BenchStep,),
        {
            "step_id": step_id,
            "deps": deps,
            "image": image,
            "__module__": __name__,
            **extra,
        },
    )
    globals()[cls.__name__] = cls
    return cls()


STEPS: tuple[Step, ...] = (
    _step("story_source", ()),
    _step("entity_canon", ("story_source",)),
    _step("world_guide", ("story_source", "entity_canon")),
    _step(
        "scene_detail",
        ("story_source", "entity_canon", "world_guide"),
        resume_config_keys=("scenes.shots_per_scene",),
    ),
    _step("entity_t2i", ("entity_canon",), allow_auto_rerun_on_schema_bump=True),
    _step("shot_dependency_t2i", ("scene_detail",)),
    _step("t2i_review", ("scene_detail", "entity_t2i"), modifies_checkpoints=("scene_detail",)),
    _step("ref_image_gen", ("entity_canon", "entity_t2i", "t2i_review"), image="refs/C01.png"),
    _step("composite_image_gen", ("ref_image_gen",), image="C01_O01.png"),
    _step(
        "scene_image_pipeline",
        ("scene_detail", "shot_dependency_t2i", "composite_image_gen", "t2i_review"),
        image="shots/S01.png",
    ),
)


# ----------------------------------------------------------------------------- generation
def generate(home: Path, ledger: LedgerStore, episodes: int) -> list[str]:
    """Completed rows and valid envelopes (+ PNGs) for every (episode, step)."""
    config = ProjectConfig().as_dict()
    masked = mask_secrets(config)
    base = datetime.now(UTC) - timedelta(hours=1)
    rows: list[dict[str, Any]] = []
    keys = [f"bench/e{n:05d}" for n in range(episodes)]
    png_sha256 = hashlib.sha256(PNG).hexdigest()
    for n, pk in enumerate(keys):
        project, episode = pk.split("/")
        inputs = home / "projects" / project / "episodes" / episode
        inputs.mkdir(parents=True, exist_ok=True)
        (inputs / "story.md").write_text(f"# {episode}\n\nOnce upon a time.\n")
        # Rows finished over the past days (newest first), like a real ledger.
        ts = format_timestamp(base - timedelta(seconds=60 * n))
        for step in STEPS:
            assert isinstance(step, BenchStep)
            folder = home / "checkpoints" / project / episode / step.step_id
            artifacts: tuple[Artifact, ...] = ()
            if step.image:
                target = folder / step.image
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(PNG)
                artifacts = (Artifact(step.image, png_sha256, len(PNG)),)
            else:
                folder.mkdir(parents=True, exist_ok=True)
            fingerprints = scoped_fingerprints(config, step.resume_config_keys)
            run_id = f"gen-{episode}-{step.step_id}:0"
            checkpoint = Checkpoint(
                step_id=step.step_id,
                project_id=project,
                episode_id=episode,
                status="completed",
                schema_version=step.schema_version,
                config_hash=config_hash(fingerprints),
                resume_config_keys=tuple(step.resume_config_keys),
                config_fingerprints=fingerprints,
                project_config_snapshot=masked,
                data={"items": [f"{episode}-{step.step_id}-{i}" for i in range(3)], "count": 3},
                artifacts=artifacts,
                produced_by={"run_id": run_id, "started_at": ts},
                created_at=ts,
            )
            (folder / "checkpoint.json").write_text(checkpoint.to_json(), encoding="utf-8")
            rows.append(
                {
                    "id": str(uuid.uuid4()),
                    "project_id": project,
                    "episode_id": episode,
                    "step_id": step.step_id,
                    "status": "completed",
                    "run_id": run_id,
                    "started_at": ts,
                    "completed_at": ts,
                    "created_at": ts,
                    "updated_at": ts,
                    "recovery_count": 0,
                }
            )
    # Seal every row as its run would have (the same store call, after the files settled:
    # a run seals right after its exit verification).
    time.sleep(0.05)
    store = CheckpointStore(home)
    graph = StepGraph(STEPS)
    runtimes = {
        step.step_id: StepJudge(
            step,
            graph=graph,
            settings=ResumeSettings(home=home),
            ledger=ledger,
            checkpoints=store,
        )
        for step in STEPS
    }
    for row in rows:
        key = StepKey(row["project_id"], row["episode_id"], row["step_id"])
        runtime = runtimes[key.step_id]
        checkpoint = store.load(key)
        assert checkpoint is not None
        reads = runtime.verifier_reads(runtime.context(key))
        row["checkpoint_seal"] = store.seal(
            checkpoint, reads, revision=runtime.step.verify_revision
        )
        assert row["checkpoint_seal"], key
    with ledger.engine.begin() as conn:  # synthetic bulk load (the benchmark's own SQL)
        for start in range(0, len(rows), 5000):
            conn.execute(sa.insert(step_run), rows[start : start + 5000])
    return keys


def change_one_percent(home: Path, ledger: LedgerStore, keys: list[str]) -> int:
    """Half of 1 % lose a PNG (disk), half get a failed ledger row (ledger ops)."""
    chosen = keys[::100] or keys[:1]
    for n, pk in enumerate(chosen):
        project, episode = pk.split("/")
        if n % 2 == 0:
            (
                home
                / "checkpoints"
                / project
                / episode
                / "scene_image_pipeline"
                / "shots"
                / "S01.png"
            ).unlink()
        else:
            key = StepKey(project, episode, "composite_image_gen")
            assert ledger.claim(key, "bench-fail:0")
            assert ledger.transition(key, "bench-fail:0", "failed")
    return len(chosen)


# ----------------------------------------------------------------------------- one size
def run_size(episodes: int, server_url: str, keep: bool, workers: int | None) -> dict[str, Any]:
    name = f"bench_sensor_{episodes}"
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
            cursor: list[str | None] = [None]

            def tick(label: str, which: dg.SensorDefinition = sensor) -> None:
                context = dg.build_sensor_context(
                    instance=instance,
                    cursor=cursor[0] if which is sensor else None,
                    definitions=defs,
                    resources={"pipeline": pipeline},
                )
                profile_to = os.environ.get("SENSOR_TICK_PROFILE") if label == "cold" else None
                profiler = cProfile.Profile() if profile_to else None
                t0, c0 = time.perf_counter(), time.process_time()
                with dg.partition_loading_context(dynamic_partitions_store=instance):
                    if profiler is not None:
                        profiler.enable()
                    result = which.evaluate_tick(context)
                    if profiler is not None:
                        profiler.disable()
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                if profiler is not None and profile_to:
                    profiler.dump_stats(profile_to)  # SENSOR_TICK_PROFILE=file: the cold tick
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
                }

            tick("cold")
            tick("warm")
            out["changed"] = change_one_percent(home, ledger, keys)
            tick("one_percent")
            tick("warm_after")
            now[0] += timedelta(seconds=FULL_REFRESH + 1)
            tick("full")
            tick("cold_unsealed", unsealed)
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
    from pipeline_defs.judging.evaluation import Stores

    return Stores.of(pipeline)


# ----------------------------------------------------------------------------- driver
def table(results: list[dict[str, Any]]) -> str:
    """Wall seconds (CPU seconds of the sensor process) per tick kind."""

    def cell(r: dict[str, Any], kind: str) -> str:
        t = r[kind]
        if t["seconds"] < 1:
            return f"{t['seconds'] * 1000:.0f} ms ({t['cpu_seconds'] * 1000:.0f} ms CPU)"
        return f"{t['seconds']:.2f} s ({t['cpu_seconds']:.2f} s CPU)"

    head = (
        "| episodes x steps | cold tick | warm, no change | after 1 % changed | "
        "re-judged after 1 % | full re-judge, warm caches | cold tick without seals | "
        "load avg (before / max) |"
    )
    lines = [head, "|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in results:
        one = r["one_percent"]
        lines.append(
            f"| {r['episodes']:,} x 10 | {cell(r, 'cold')} | {cell(r, 'warm')} | "
            f"{cell(r, 'one_percent')} | {one['partitions_judged']} partitions "
            f"({one['judged']} judge calls), {one['row_queries']} row query "
            f"({one['rows']} rows), {one['launches']} launches | {cell(r, 'full')} | "
            f"{cell(r, 'cold_unsealed')} | {r['load_before']} / {max(r['load_during'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(
            "PIPELINE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
        ),
        help="a PostgreSQL server database we may CREATE DATABASE from",
    )
    parser.add_argument("--keep", action="store_true", help="keep databases and homes")
    parser.add_argument(
        "--workers", type=int, default=None, help="judge processes (default: one per CPU)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_size(args.one, args.pg_url, args.keep, args.workers)))
        return
    results = []
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory(prefix="bench-dagster-") as dagster_home:
            child = subprocess.run(
                [sys.executable, __file__, "--one", str(size), "--pg-url", args.pg_url]
                + (["--keep"] if args.keep else [])
                + (["--workers", str(args.workers)] if args.workers else []),
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
