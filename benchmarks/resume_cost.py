"""Resume cost on scenarios: provider calls and step executions.

Every scenario starts from the SAME completed state: the ten assets materialized once for
episode ``ep01`` of the bundled sample (offline deterministic providers) in a template home
with its own ledger. A scenario is applied to a copy of that template (home directory copy +
ledger copy: the SQLite file, or with ``--pg-url`` a fresh PostgreSQL database created from
the template database), and each policy then runs on its own copy of the scenario state, so
the four policies see byte-identical starting points. Costs are read back from the ledger:
provider calls from ``provider_call`` (kind text/image), step executions from the audit
table ``step_transition`` (rows whose action is a claim: ``rerun_self`` (incl. "first run"),
``force_explicit``, ``stale_running_recovery`` — a step whose body ran).

Policies:

(a) ours: one ``dg.materialize`` of all ten assets for the partition, mode resume.
(b) naive "any doubt → force and invalidate downstream", with the doubts a resume sees
    without a judge that classifies them (docs/DESIGN.md#problem): every step in any way in
    doubt — not completed, checkpoint or artifact missing or invalid (read-only
    ``StepJudge.judge``: every non-SKIP decision, BLOCK included), a checkpoint edited in
    place after it was published (``mutations`` non-empty: its content hash drifted), or a
    masked project-config snapshot that differs from the current project file (a
    whole-config hash, no scoped keys). The doubted steps are launched with the run tag
    ``resume/mode=force`` (which invalidates their downstream), then all ten assets are
    resumed (staled downstream re-runs).
(b*) the same force-then-resume fed by our judge's doubts only (non-SKIP decisions): not a
    target, shown to separate the two effects (classifying doubt vs. forcing on it).
(c) plain Dagster without the judge: re-materialize the affected assets and all their
    downstream, executing every step body in that set. Modelled as ONE launch of that set
    with ``resume/mode=force`` (force runs every body; as each forced step invalidates its
    downstream, a downstream image step finds no previous checkpoint and redraws all its
    images, like an asset body that regenerates its output; the first forced image step of
    the set still keeps its own valid PNGs, since a force archives only downstream
    checkpoints). In S6 the dead run's lease is first reset (``LedgerStore.reset_running``,
    the operator's ``reset-running``), because plain Dagster has no lease that would refuse
    the re-run. "Affected" = the assets whose checkpoint or inputs the scenario changed:
    S1 scene_detail + entity_t2i (their data versions changed when t2i_review mutated them);
    S2 composite_image_gen; S3 the three image steps; S4 every asset (a project-config file
    changed and plain Dagster has no scoped config hash: the file is an input/code version
    of every asset that reads project config, i.e. all ten); S5 scene_detail; S6
    scene_image_pipeline.
(d) oracle: the minimum work, from the scenario definition: the images missing or invalid
    on disk compared with the template's records, drawn once each by the steps owning them;
    everything else zero (S5 is a BLOCK by design: 0 calls).

Scenarios:

S1  the incident: t2i_review has fixed prompts in scene_detail / entity_t2i (the template
    already contains that mutation); resume all.
S2  one composite PNG deleted.
S3  the ledger says completed but the image steps' checkpoints were restored without
    their images (every PNG of ref/composite/scene images deleted, envelopes kept).
S4  an unrelated project-config key edited (``title``).
S5  a key of scene_detail's own ``resume_config_keys`` edited (``scenes.camera_style``).
S6  a run killed with SIGKILL in the middle of scene_image_pipeline, then recovery after the
    running timeout. A real subprocess materializes scene_image_pipeline with
    ``PIPELINE_OFFLINE_LATENCY_MS`` set; it is killed once ``--kill-after`` shot PNGs exist;
    the policies run after the lease is older than the running timeout
    (``PIPELINE_RUNNING_TIMEOUT_SECONDS``, ``--running-timeout``, default 2 s; ours →
    STALE_RUNNING_RECOVERY). Two variants, both from the template:
    S6a  the shot PNGs had been lost (checkpoint kept), the resume redrawing them is killed:
         the previous checkpoint vouches for the PNGs already redrawn;
    S6b  the first run of scene_image_pipeline is killed (its checkpoint, PNGs and ledger
         row removed first): no checkpoint records the PNGs the dead run wrote.

Targets: (a) = (d) (calls and executions) in every scenario; on S1 and S4, (a) makes >= 5x
fewer provider calls than (b) and than (c). Prints PASS/FAIL per
target, a table, and saves a bar chart. Example (the command recorded in BENCHMARKS.md):

    .venv/bin/python benchmarks/resume_cost.py \\
        --pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

import argparse
import contextlib
import functools
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/resume_cost.py` from anywhere
    sys.path.insert(0, str(ROOT))

import dagster as dg  # noqa: E402
import resume_cost_env  # noqa: E402
from resume_cost_env import (  # noqa: E402
    EPISODE,
    POLICIES,
    POLICY_NAMES,
    SHOT_STEP,
    STEP_IDS,
    Env,
    create_pg_database,
    failures,
    scratch_dir,
)
from resume_cost_policies import Cost, measure, oracle, policy_naive, policy_ours, policy_plain  # noqa: E402
from resume_cost_report import cell, check_targets, compact_table, markdown_table, save_chart  # noqa: E402
from resume_cost_scenarios import scenarios  # noqa: E402


def child_main(home: str, db_url: str) -> int:
    """``--child-run``: materialize scene_image_pipeline (the run that will be killed)."""
    env = Env(Path(home).parent, db_url)
    result = env.materialize([SHOT_STEP])
    print("child finished:", result.success, failures(result), flush=True)
    return 0


# ----------------------------------------------------------------------------- main
def build_template(args: argparse.Namespace) -> tuple[Env, Cost]:
    root = scratch_dir("template")
    if args.pg_url:
        env = Env(root, create_pg_database(args.pg_url), args.pg_url)
    else:
        env = Env.sqlite(root)
    env.write_episode()
    cost = measure(env, policy_ours)
    rows = env.ledger.get_many(episodes=[EPISODE])
    statuses = {k.step_id: r.status for k, r in rows.items()}
    if statuses != dict.fromkeys(STEP_IDS, "completed") or cost.notes:
        raise RuntimeError(f"template run did not complete: {statuses} {cost.notes}")
    scene_detail = env.checkpoints.load(env.key("scene_detail"))
    assert scene_detail is not None and scene_detail.mutations, "t2i_review did not mutate"
    return env, cost


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--pg-url",
        default=None,
        help="PostgreSQL server URL: the template ledger and a fresh database per "
        "(scenario, policy) are created there (default: SQLite file copies)",
    )
    parser.add_argument(
        "--scenarios",
        default="S1,S2,S3,S4,S5,S6a,S6b",
        help="scenarios run, comma separated (default all: S1,S2,S3,S4,S5,S6a,S6b)",
    )
    parser.add_argument("--kill-after", type=int, default=3, help="S6: shot PNGs before SIGKILL")
    parser.add_argument("--latency-ms", type=int, default=300, help="S6: offline latency/call")
    parser.add_argument("--running-timeout", type=int, default=2, help="S6: seconds")
    parser.add_argument(
        "--chart",
        type=Path,
        default=ROOT / "benchmarks/results/resume_cost.png",
        help="where the chart is written (default benchmarks/results/resume_cost.png)",
    )
    parser.add_argument(
        "--db-prefix",
        default="rc",
        help="name prefix of the PostgreSQL databases it creates and drops (default rc)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a short run (CI): scenario S2 only, the chart into a temporary directory",
    )
    parser.add_argument("--child-run", nargs=2, metavar=("HOME", "DB_URL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_run:
        return child_main(*args.child_run)
    resume_cost_env.DB_PREFIX = args.db_prefix  # the databases create_pg_database names
    if args.smoke:
        args.scenarios = "S2"
        args.chart = Path(tempfile.mkdtemp(prefix="resume-cost-smoke-")) / "resume_cost.png"

    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    started = time.perf_counter()
    print(
        f"# resume cost  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  python {platform.python_version()}"
        f"  dagster {dg.__version__}  ledger {'postgresql' if args.pg_url else 'sqlite'}"
        f"  cpus {os.cpu_count()}  load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    base, full = build_template(args)
    print(
        f"template: full pipeline = {full.text} text + {full.image} image calls, "
        f"{full.executions} step executions ({full.seconds:.1f} s)",
        flush=True,
    )
    results: dict[str, dict[str, Cost]] = {}
    titles: dict[str, str] = {}
    facts: dict[str, dict[str, Any]] = {}
    try:
        for scenario in scenarios(args):
            if scenario.sid not in wanted:
                continue
            titles[scenario.sid] = scenario.title
            state = scenario.prepare(base)
            try:
                row: dict[str, Cost] = {}
                policies: dict[str, Callable[[Env, Cost], None]] = {
                    "a": policy_ours,
                    "b": policy_naive,
                    "bj": functools.partial(policy_naive, judge_only=True),
                    "c": policy_plain(scenario.affected, scenario.reset_running_for_plain),
                }
                for policy, action in policies.items():
                    env = state.clone()
                    try:
                        row[policy] = measure(env, action)
                    finally:
                        env.destroy()
                row["d"] = oracle(base, state, blocked=scenario.oracle_blocked)
            finally:
                state.destroy()
            results[scenario.sid] = row
            facts[scenario.sid] = dict(scenario.facts)
            print(f"{scenario.sid} {scenario.title}", flush=True)
            if scenario.facts:
                print(f"   facts: {scenario.facts}")
            for policy in POLICIES:
                cost = row[policy]
                print(f"   {POLICY_NAMES[policy]:<42} {cell(cost)}  ({cost.seconds:.1f} s)")
                for note in cost.notes:
                    print(f"      - {note}")
                if cost.executed:
                    print(f"      - executed: {', '.join(cost.executed)}")
    finally:
        base.destroy()

    print("\n" + compact_table(results))
    print("\n" + markdown_table(results, titles))
    print("\nTargets:")
    checks = check_targets(results)
    for name, ok, why in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}  — {why}")
    save_chart(results, args.chart, titles)
    print(f"\nchart: {args.chart}  total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
