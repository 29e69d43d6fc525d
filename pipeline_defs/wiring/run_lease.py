"""Every run's coordinator holds a run lease (docs/DESIGN.md#run-leases).

The executor is the one thing every launch path's coordinator runs: a run worker launched by
the daemon (UI, sensor, backfill), ``storyboard materialize`` on the fleet. :func:`leased`
wraps any executor definition so that its ``execute`` holds a :class:`RunLease` on the run
for as long as it hands steps out; the rest (config, requirements, retries, the step
dependency config) is the wrapped executor's. ``storyboard materialize`` in one process
(``execute_in_process``, which uses no job executor) holds the same lease itself
(``operations/runs.py``).
"""

import logging
from collections.abc import Iterator
from typing import Any

import dagster as dg

from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.steps.lease import RunLease
from pipeline_defs.wiring.run_retries import reopen_run_retries
from resources.pipeline import PipelineResource

_log = logging.getLogger(__name__)


class LeasedExecutor(dg.Executor):
    """``inner``, its ``execute`` under the run's lease (composition: everything else is
    ``inner``'s)."""

    def __init__(self, inner: dg.Executor, pipeline: PipelineResource) -> None:
        self.inner = inner
        self.pipeline = pipeline

    @property
    def retries(self) -> Any:
        return self.inner.retries

    @property
    def step_dependency_config(self) -> Any:
        return self.inner.step_dependency_config

    def get_step_event_or_retry_event(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.get_step_event_or_retry_event(*args, **kwargs)

    def log_failure_or_retry_event_after_error(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.log_failure_or_retry_event_after_error(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """Whatever else the wrapped executor offers its own execution loop (dagster-celery's
        reads ``app_args()`` from the run's executor)."""
        if name == "inner":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[dg.DagsterEvent]:
        # A re-execution copies its parent's tags: a run-retry stop among them is taken
        # back before any step runs (docs/DESIGN.md#recovery-buttons).
        reopen_run_retries(plan_context.instance, plan_context.dagster_run)
        with run_lease(self.pipeline, str(plan_context.run_id)):
            yield from self.inner.execute(plan_context, execution_plan)


def run_lease(pipeline: PipelineResource, run_id: str) -> RunLease:
    """The lease a coordinator holds on ``run_id``, renewed at the heartbeat of the settings
    in force (the default heartbeat when the ledger cannot say: ``RunLease`` is fail-soft)."""
    try:
        interval = pipeline.settings().heartbeat_seconds
    except Exception as exc:
        _log.warning("run %s: settings unreadable (%s); default heartbeat", run_id, exc)
        interval = ResumeSettings().heartbeat_seconds
    return RunLease(pipeline.ledger(), run_id, interval_seconds=interval, log=_log)


def leased(
    executor_def: dg.ExecutorDefinition, pipeline: PipelineResource
) -> dg.ExecutorDefinition:
    """``executor_def`` whose executor holds the run's lease while it executes."""

    def create(init_context: dg.InitExecutorContext) -> dg.Executor:
        return LeasedExecutor(executor_def.executor_creation_fn(init_context), pipeline)  # type: ignore[misc]

    return dg.ExecutorDefinition(
        name=executor_def.name,
        config_schema=executor_def.config_schema.as_field(),
        requirements=executor_def.get_requirements,
        executor_creation_fn=create,
        description=executor_def.description,
    )
