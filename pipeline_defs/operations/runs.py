"""Running assets in-process through the Dagster instance of ``DAGSTER_HOME``, judged as
any UI, sensor or backfill launch; the CLI only adds its tags."""

import functools
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dagster as dg

from pipeline_defs.operations.operator_words import utc_now
from pipeline_defs.operations.run_report import Progress, RunReport, StepReport, summarize_run
from pipeline_defs.operations.shadow_decide import judge_now
from pipeline_defs.operations.watcher import RunWatcher
from pipeline_defs.operations.workspace import Workspace, load_definitions
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import Episode
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.wiring.assets import LAUNCH_PATH_TAG
from pipeline_defs.wiring.fleet import check_shared_instance

CLI_TAGS: Mapping[str, str] = {LAUNCH_PATH_TAG: "cli"}
# A run on the fleet gets its id from Dagster: the CLI finds it by this tag to follow it.
LAUNCH_ID_TAG = "storyboard/launch_id"
PARTITION_TAG = "dagster/partition"
FLEET_CLI_JOB = "storyboard_cli"
QUIET_RUN_CONFIG: Mapping[str, Any] = {
    "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}
}


def _check_partition(ws: Workspace, partition_key: str) -> dg.DagsterInstance:
    """A run needs the partition registered in the instance (as the UI and sensor do)."""
    ws.require_partitions([partition_key])
    instance = ws.instance()
    assert instance is not None
    return instance


def run_assets(
    ws: Workspace,
    partition_key: str,
    step_ids: Sequence[str] | None = None,
    *,
    tags: Mapping[str, str] = CLI_TAGS,
    progress: Callable[[Progress], None] | None = None,
) -> RunReport:
    """Materialize ``step_ids`` (default: all) of one partition in-process, judged as any run."""
    if not ws.steps:
        raise PipelineError(
            ErrorCode.INPUT_INVALID,
            "the code location defines no steps (STORYBOARD_STEPS is empty)",
        )
    selected = [ws.step(s).step_id for s in (step_ids or [s.step_id for s in ws.steps])]
    instance = _check_partition(ws, partition_key)
    blocked, waiting = _blocked_and_waiting(ws, partition_key, selected)
    selected = [s for s in selected if s not in waiting]
    run_id = str(uuid.uuid4())
    if not selected:  # everything asked for waits on a block: launch nothing
        report = RunReport(run_id, partition_key, False, tags.get(LAUNCH_PATH_TAG, "api"))
        report.steps = [StepReport(step=s, outcome="waiting", error=w) for s, w in waiting.items()]
        return report
    on_fleet = ws.job().executor_def.name == "celery"
    if on_fleet:
        check_shared_instance(instance)
    watcher = RunWatcher(instance, None if on_fleet else run_id, progress or (lambda _p: None))
    if on_fleet:
        # Each step is a Celery task; a worker rebuilds the job from the Definitions' spec.
        launch_id = run_id
        watcher.find_by_tags({LAUNCH_ID_TAG: launch_id})
        with watcher:
            fleet_result = dg.execute_job(
                dg.build_reconstructable_job(
                    __name__,
                    fleet_job.__name__,
                    reconstructable_args=(ws.spec,),
                    reconstructor_working_directory=os.getcwd(),
                ),
                instance,
                run_config=dict(QUIET_RUN_CONFIG),
                tags={**tags, PARTITION_TAG: partition_key, LAUNCH_ID_TAG: launch_id},
                asset_selection=[dg.AssetKey(s) for s in selected],
            )
        run_id, success = fleet_result.run_id, fleet_result.success
    else:
        # In one process no executor runs: this process is the coordinator, and holds the
        # run's lease itself (docs/DESIGN.md#run-leases).
        with watcher, ws.run_lease(run_id):
            result = ws.job().execute_in_process(
                partition_key=partition_key,
                instance=instance,
                raise_on_error=False,
                run_id=run_id,
                tags=dict(tags),
                asset_selection=[dg.AssetKey(s) for s in selected],
                run_config=dict(QUIET_RUN_CONFIG),
            )
        success = result.success
    report = summarize_run(
        ws,
        run_id,
        partition_key,
        selected,
        watcher.timeline,  # drained to the end when the watcher stopped
        success=success,
        launch_path=tags.get(LAUNCH_PATH_TAG, "api"),
        dagster_status="SUCCESS" if success else "FAILURE",
    )
    for step in report.steps:
        if step.outcome == "failed" and step.step in blocked:  # the block's way out
            step.next_step = blocked[step.step]
    for step_id, why in waiting.items():
        report.steps.append(StepReport(step=step_id, outcome="waiting", error=why))
    if waiting:
        report.success = False  # what was asked for is not all done
    return report


@functools.cache  # a worker process rebuilds it for every step it runs: once is enough
def fleet_job(spec: str) -> dg.JobDefinition:
    """Every asset of ``spec`` as one job, rebuilt in each Celery worker that runs a step.

    Dagster rebuilds a job launched with ``execute_job`` from a function; the implicit
    asset job's reserved name cannot be handed over that way, so the CLI's runs on the fleet
    carry this job's name (the steps, resources and executor are the code location's).
    """
    job = dg.define_asset_job(FLEET_CLI_JOB, selection=dg.AssetSelection.all())
    merged = dg.Definitions.merge(load_definitions(spec), dg.Definitions(jobs=[job]))
    return merged.resolve_job_def(FLEET_CLI_JOB)


def _blocked_and_waiting(
    ws: Workspace, partition_key: str, selected: Sequence[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Judged as the sensor judges now: the selected steps that are blocked (with what to do
    about each) and the selected steps downstream of one, which can only wait on it.

    The blocked step is still launched: its run fails with the block's typed code, the true
    record. Its dependents are left out of the run: launched, Dagster would skip them and
    show them failed, although nothing is wrong with them (docs/DESIGN.md#launch-paths).
    """
    judged = judge_now(ws, [Episode.parse(partition_key)], utc_now())
    blocked = {
        item["step"]: item["what_to_do"] or item["reason"]
        for item in judged
        if item["verdict"] == "blocked"
    }
    graph = StepGraph(ws.steps)
    waiting: dict[str, str] = {}
    for step_id in selected:
        if step_id in blocked:
            continue
        upstream = [u for u in graph.upstream(step_id) if u in blocked]
        if upstream:
            ways = "; ".join(f"{u}: next: {blocked[u]}" for u in upstream if u not in selected)
            waiting[step_id] = (
                f"not launched: it waits on blocked upstream {', '.join(upstream)}"
                + (f" ({ways})" if ways else "")
            )
    return blocked, waiting
