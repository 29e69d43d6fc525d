"""What the single judge costs per step execution, on PostgreSQL and SQLite.

For a no-op step (no deps, no artifacts, no provider calls, default verifier) this measures:

1. ``StepRunner.run`` called directly — gate + ledger read + judge (checkpoint load, project
   config, ``decide``) + claim + audit + body + envelope + exit verify + owner-aware status
   with fenced publish (staged file, row lock, rename) + audit + recovery reset:
   - ``rerun_self``: a fresh partition key each iteration (first run → RERUN_SELF → publish);
   - ``skip``: the same keys again (judge → SKIP, one audit row, nothing written).
   The body itself is measured alone too (``body``) so the judge's share is the difference.
2. In the same process, whole Dagster runs via ``dg.materialize`` on one ephemeral instance:
   - ``plain``: a partitioned no-op asset with Dagster's default IO manager (pickles to disk);
   - ``judged (rerun_self)`` / ``judged (skip)``: the same step through ``build_step_assets``
     and the checkpoint IO manager, on fresh / already-completed partitions.
   - ``plain_like``: the judged asset's Dagster footprint without the judge (the same four
     resources incl. the checkpoint IO manager, the ``resume_integrity`` check spec and an
     explicit DataVersion), so ``judged - plain_like`` isolates the judge inside Dagster.
   "judge adds" = median(judged materialize) - median(plain materialize), and the same
   against ``plain_like``.

PostgreSQL comes from ``--pg-url`` / ``PIPELINE_BENCH_PG_URL`` / ``PIPELINE_TEST_PG_URL``; a
fresh database is created and dropped. Example (the command recorded in BENCHMARKS.md):

    PIPELINE_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test \\
        .venv/bin/python benchmarks/judge_overhead.py --runs 500 --dagster-runs 60
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/judge_overhead.py` from anywhere
    sys.path.insert(0, str(ROOT))

import dagster as dg  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from pipeline_defs.resume.partition import StepKey  # noqa: E402
from pipeline_defs.steps.graph import StepGraph  # noqa: E402
from pipeline_defs.steps.judge import StepJudge  # noqa: E402
from pipeline_defs.steps.runner import RunInfo, StepRunner  # noqa: E402
from pipeline_defs.steps.spec import Step, StepResult  # noqa: E402
from pipeline_defs.wiring.assets import build_step_assets, episodes  # noqa: E402
from pipeline_defs.wiring.io_manager import CheckpointIOManager  # noqa: E402
from resources.checkpoints.atomic import atomic_write_bytes  # noqa: E402
from resources.pipeline import PipelineResource  # noqa: E402
from resources.providers import OfflineImageModel, TextModel  # noqa: E402

TARGET_MS = 10.0


class NoOp(Step):
    """The cheapest possible step: the protocol around it is all that is measured."""

    step_id = "noop"
    description = "benchmark no-op step"

    def execute(self, ctx: Any, inputs: Mapping[str, Any]) -> StepResult:
        return StepResult(data={"ok": True})


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "median_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(p95 * 1000, 3),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3),
    }


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


@contextmanager
def _postgres(server_url: str, prefix: str) -> Iterator[str]:
    for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
        if server_url.startswith(prefix):
            server_url = "postgresql+psycopg://" + server_url[len(prefix) :]
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        from resources.ledger.store import engine_for

        engine_for(url).dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


LEDGER_OPS = ("get", "claim", "append_transition", "transition", "reset_recovery")
STORE_OPS = ("load", "is_unchanged", "stage")


@contextmanager
def _op_timer(*targets: tuple[Any, tuple[str, ...]]) -> Iterator[dict[str, list[float]]]:
    """Time named methods of the given objects (instance attributes shadow the methods)."""
    samples: dict[str, list[float]] = {}
    patched: list[tuple[Any, str]] = []
    for obj, names in targets:
        for name in names:
            original = getattr(obj, name)
            bucket = samples.setdefault(f"{type(obj).__name__}.{name}", [])

            def timed(*args: Any, _fn: Any = original, _b: Any = bucket, **kw: Any) -> Any:
                started = time.perf_counter()
                try:
                    return _fn(*args, **kw)
                finally:
                    _b.append(time.perf_counter() - started)

            setattr(obj, name, timed)
            patched.append((obj, name))
    try:
        yield samples
    finally:
        for obj, name in patched:
            delattr(obj, name)


def bench_runtime(home: Path, url: str, runs: int) -> dict[str, Any]:
    pipeline = PipelineResource(home=str(home), db_url=url)
    step = NoOp()
    ledger, checkpoints = pipeline.ledger(), pipeline.checkpoints()
    judge = StepJudge(
        step,
        graph=StepGraph([step]),
        settings=pipeline.settings(),
        ledger=ledger,
        checkpoints=checkpoints,
    )
    runtime = StepRunner(judge, ledger=ledger, checkpoints=checkpoints)
    runtime.ledger.migrate()
    tag = uuid.uuid4().hex[:6]
    keys = [f"bench/rt{tag}e{i}" for i in range(runs)]
    warm = [f"bench/warm{tag}e{i}" for i in range(20)]
    for key in warm:  # connections, caches, imports
        runtime.run(key, RunInfo(f"warm-{key}:0"), {})
        runtime.run(key, RunInfo(f"warm2-{key}:0"), {})

    rerun: list[float] = []
    outcomes: set[str] = set()
    for i, key in enumerate(keys):
        started = time.perf_counter()
        outcome = runtime.run(key, RunInfo(f"bench-{i}:0"), {})
        rerun.append(time.perf_counter() - started)
        outcomes.add(outcome.decision.action.value)
    assert outcomes == {"rerun_self"}, outcomes

    # Where a RERUN_SELF run spends its time: the same loop again on fresh keys, with the
    # ledger and checkpoint-store operations timed (a separate pass, so the timers do not
    # disturb the headline figures above).
    extra = [f"bench/op{tag}e{i}" for i in range(min(runs, 200))]
    with _op_timer((runtime.ledger, LEDGER_OPS), (runtime.checkpoints, STORE_OPS)) as per_op:
        for i, key in enumerate(extra):
            runtime.run(key, RunInfo(f"bench-op-{i}:0"), {})
    breakdown = {
        name: {
            "calls_per_run": round(len(samples) / len(extra), 2),
            "ms_per_run": round(sum(samples) / len(extra) * 1000, 3),
        }
        for name, samples in per_op.items()
    }

    skip: list[float] = []
    outcomes = set()
    for i, key in enumerate(keys):
        started = time.perf_counter()
        outcome = runtime.run(key, RunInfo(f"bench-skip-{i}:0"), {})
        skip.append(time.perf_counter() - started)
        outcomes.add(outcome.decision.action.value)
    assert outcomes == {"skip"}, outcomes

    judge_only: list[float] = []
    for key in keys[:runs]:
        step_key = judge.key(key)
        judge_only.append(
            _timed(
                lambda k=step_key: judge.judge(k, mode=RunInfo("x").mode, row=runtime.ledger.get(k))
            )
        )

    context = judge.context(StepKey("bench", "body", "noop"))
    body = [_timed(lambda: step.execute(context, {})) for _ in range(runs)]

    # The durable I/O floor on this machine: one committed single-row insert (what each
    # ledger write costs at least) and one atomic file write (temp file, fsync, rename,
    # directory fsync), which a publish needs once.
    engine = runtime.ledger.engine
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS bench_floor (x integer)")

    def commit_one() -> None:
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO bench_floor VALUES (1)")

    commit = [_timed(commit_one) for _ in range(runs)]
    target = home / "floor" / "file.json"
    atomic = [_timed(lambda: atomic_write_bytes(target, b"{}")) for _ in range(runs)]
    rows = runtime.ledger.get_many(step_ids=["noop"])
    expected = runs + len(warm) + len(extra)
    assert sum(1 for r in rows.values() if r.status == "completed") == expected
    return {
        "rerun_self": _ms(rerun),
        "skip": _ms(skip),
        "judge_read_only": _ms(judge_only),
        "body": _ms(body),
        "floor_commit": _ms(commit),
        "floor_atomic_write": _ms(atomic),
        "rerun_self_breakdown": breakdown,
    }


@dg.asset(partitions_def=episodes, name="plain_noop")
def plain_noop() -> dict[str, bool]:
    """The same no-op, as plain Dagster: default IO manager, no judge."""
    return {"ok": True}


class _NoText(TextModel):
    pass


@dg.asset(
    partitions_def=episodes,
    name="plain_like",
    check_specs=[dg.AssetCheckSpec("resume_integrity", asset="plain_like")],
    required_resource_keys={"pipeline", "text_model", "image_model"},
    io_manager_key="checkpoint_io_manager",
)
def plain_like() -> Iterator[Any]:
    """The judged asset's Dagster footprint without the judge: the same four resources
    (incl. the checkpoint IO manager, handed ``None`` so it writes nothing), an asset check
    and an explicit DataVersion. judged - plain_like = what the judge itself costs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        yield dg.Output(None, data_version=dg.DataVersion("same"))
    yield dg.AssetCheckResult(check_name="resume_integrity", passed=True)


def bench_dagster(home: Path, url: str, runs: int) -> dict[str, Any]:
    pipeline = PipelineResource(home=str(home), db_url=url)
    resources = {
        "pipeline": pipeline,
        "checkpoint_io_manager": CheckpointIOManager(pipeline=pipeline),
        "text_model": _NoText(),
        "image_model": OfflineImageModel(),
    }
    judged_assets = build_step_assets([NoOp()])
    tag = uuid.uuid4().hex[:6]
    fresh = [f"bench/dg{tag}e{i}" for i in range(runs)]
    warm = [f"bench/dgwarm{tag}e{i}" for i in range(5)]
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("episodes", [*warm, *fresh])

    # Both sides log at ERROR only: console DEBUG lines would otherwise dominate both.
    quiet = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}

    def plain(key: str) -> None:
        result = dg.materialize(
            [plain_noop], partition_key=key, instance=instance, run_config=quiet
        )
        assert result.success

    def like(key: str) -> None:
        result = dg.materialize(
            [plain_like],
            partition_key=key,
            instance=instance,
            resources=resources,
            run_config=quiet,
        )
        assert result.success

    def judged(key: str) -> str:
        result = dg.materialize(
            judged_assets,
            partition_key=key,
            instance=instance,
            resources=resources,
            run_config=quiet,
        )
        assert result.success
        mat = result.asset_materializations_for_node("noop")[0]
        return str(mat.metadata["resume/decision"].value)

    try:
        for key in warm:
            plain(key)
            like(key)
            judged(key)
        plain_times: list[float] = []
        like_times: list[float] = []
        judged_rerun: list[float] = []
        judged_skip: list[float] = []
        for key in fresh:  # interleaved so drift in machine load hits all three alike
            plain_times.append(_timed(lambda k=key: plain(k)))
            like_times.append(_timed(lambda k=key: like(k)))
            started = time.perf_counter()
            # The metadata shows the decision as people read it: a fresh partition's run
            # is a first run (RERUN_SELF labelled ``first_run``).
            assert judged(key) == "first_run"
            judged_rerun.append(time.perf_counter() - started)
            started = time.perf_counter()
            assert judged(key) == "skip"
            judged_skip.append(time.perf_counter() - started)
    finally:
        instance.dispose()
    out = {
        "plain": _ms(plain_times),
        "plain_like": _ms(like_times),
        "judged_rerun_self": _ms(judged_rerun),
        "judged_skip": _ms(judged_skip),
    }
    out["judge_adds_rerun_self_ms"] = round(
        out["judged_rerun_self"]["median_ms"] - out["plain"]["median_ms"], 3
    )
    out["judge_adds_skip_ms"] = round(
        out["judged_skip"]["median_ms"] - out["plain"]["median_ms"], 3
    )
    for path in ("rerun_self", "skip"):
        out[f"judge_adds_{path}_vs_like_ms"] = round(
            out[f"judged_{path}"]["median_ms"] - out["plain_like"]["median_ms"], 3
        )
    return out


def run_backend(name: str, url: str, runs: int, dagster_runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"judge-bench-{name}-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        db = url or f"sqlite:///{Path(tmp) / 'ledger.sqlite3'}"
        print(f"[{name}] StepRunner.run x {runs} ...", file=sys.stderr, flush=True)
        runtime = bench_runtime(home, db, runs)
        print(f"[{name}] dg.materialize x {dagster_runs} x 3 ...", file=sys.stderr, flush=True)
        dagster = bench_dagster(home, db, dagster_runs)
    return {"runtime": runtime, "dagster": dagster}


def _table(results: Mapping[str, Any]) -> str:
    lines = [
        "| backend | measurement | n | median ms | p95 ms |",
        "|---|---|---:|---:|---:|",
    ]
    labels = [
        ("runtime", "rerun_self", "`StepRunner.run`, fresh key (judge+claim+finalize+publish)"),
        ("runtime", "skip", "`StepRunner.run`, SKIP (judge + audit row)"),
        ("runtime", "judge_read_only", "`StepJudge.judge` alone (reads only)"),
        ("runtime", "body", "no-op body alone"),
        ("runtime", "floor_commit", "floor: one committed 1-row INSERT"),
        ("runtime", "floor_atomic_write", "floor: one atomic file write (2 fsyncs)"),
        ("dagster", "plain", "`dg.materialize`, plain asset, default IO manager"),
        ("dagster", "plain_like", "`dg.materialize`, same resources/check/DataVersion, no judge"),
        ("dagster", "judged_rerun_self", "`dg.materialize`, judged asset, RERUN_SELF"),
        ("dagster", "judged_skip", "`dg.materialize`, judged asset, SKIP"),
    ]
    for backend, result in results.items():
        for group, key, label in labels:
            m = result[group][key]
            lines.append(
                f"| {backend} | {label} | {m['n']} | {m['median_ms']:.2f} | {m['p95_ms']:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=500, help="StepRunner.run iterations")
    parser.add_argument("--dagster-runs", type=int, default=60, help="materialize iterations")
    parser.add_argument(
        "--backends",
        default="postgresql,sqlite",
        help="ledgers measured, comma separated (default postgresql,sqlite)",
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("PIPELINE_BENCH_PG_URL") or os.environ.get("PIPELINE_TEST_PG_URL"),
        help="PostgreSQL URL for the postgresql backend (default: PIPELINE_BENCH_PG_URL, else "
        "PIPELINE_TEST_PG_URL)",
    )
    parser.add_argument(
        "--db-prefix",
        default="bench_judge",
        help="name prefix of the PostgreSQL database it creates (default bench_judge)",
    )
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument(
        "--smoke", action="store_true", help="a short run (CI): 20 runs, 3 materializations"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.runs, args.dagster_runs = 20, 3
    elif args.runs < 500:
        print("note: a stable figure needs >= 500 runs", file=sys.stderr)
    warnings.simplefilter("ignore", category=DeprecationWarning)
    os.environ.setdefault("DAGSTER_HOME", tempfile.mkdtemp(prefix="judge-bench-dagster-"))

    results: dict[str, Any] = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        if backend == "postgresql":
            if not args.pg_url:
                print("skipping postgresql: no --pg-url / PIPELINE_TEST_PG_URL", file=sys.stderr)
                continue
            with _postgres(args.pg_url, args.db_prefix) as url:
                results[backend] = run_backend(backend, url, args.runs, args.dagster_runs)
        elif backend == "sqlite":
            results[backend] = run_backend(backend, "", args.runs, args.dagster_runs)
        else:
            parser.error(f"unknown backend {backend!r}")

    print(_table(results))
    for backend, result in results.items():
        print(f"\n{backend}: RERUN_SELF breakdown (mean ms per run)")
        for op, figures in result["runtime"]["rerun_self_breakdown"].items():
            print(
                f"  {op:32s} {figures['calls_per_run']:>4} calls  {figures['ms_per_run']:8.2f} ms"
            )
    for backend, result in results.items():
        d = result["dagster"]
        verdict = "meets" if d["judge_adds_rerun_self_ms"] <= TARGET_MS else "MISSES"
        print(
            f"\n{backend}: judge adds {d['judge_adds_rerun_self_ms']:.2f} ms (RERUN_SELF) / "
            f"{d['judge_adds_skip_ms']:.2f} ms (SKIP) median per materialization vs plain "
            f"Dagster ({d['judge_adds_rerun_self_vs_like_ms']:.2f} / "
            f"{d['judge_adds_skip_vs_like_ms']:.2f} ms vs plain with the same Dagster features); "
            f"{verdict} the {TARGET_MS:.0f} ms target"
            + (" (the target is stated for PostgreSQL)" if backend != "postgresql" else "")
        )
    meta = {
        "python": platform.python_version(),
        "dagster": dg.__version__,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    print(f"\n{json.dumps(meta)}")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
