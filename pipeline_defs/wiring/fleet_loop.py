"""A run's coordinator on the fleet: dagster-celery's execution loop with a short poll tick.

dagster-celery's loop (``dagster_celery.core_execution_loop``) looks at its steps' results
once a second (``TICK_SECONDS``): a step's successors are sent up to a second after it ended,
on every link of an episode's chain, while the fleet's workers wait for work
(BENCHMARKS.md#the-fleet-steps-on-celery-workers). This is the same loop, line for line in
what it does (the same events, the same submission order by priority, the same revocation on
an interrupt, the same error at the end), polling every ``POLL_SECONDS``. A poll is cheap: a
result backend read per pending step and the plan's bookkeeping in memory.

The objects the loop works with (the plan's concurrency context, the engine events' data,
the error info) are the ones dagster-celery's loop uses, taken from its module: the loop
follows the dagster-celery pinned in pyproject.toml.
"""

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg
from celery.exceptions import TaskRevokedError
from dagster_celery.core_execution_loop import (  # type: ignore[attr-defined]
    DELEGATE_MARKER,
    EngineEventData,
    InstanceConcurrencyContext,
    _get_run_priority,
    _get_step_priority,
    _warn_on_priority_misuse,
    serializable_error_info_from_exc_info,
)
from dagster_celery.make_app import make_app
from dagster_celery.tags import DAGSTER_CELERY_QUEUE_TAG, DAGSTER_CELERY_STEP_PRIORITY_TAG

POLL_SECONDS = 0.1  # dagster-celery's loop: 1 s

StepExecutionFn = Callable[[Any, Any, Any, str, int, Any], Any]


def fleet_execution_loop(
    job_context: Any,
    execution_plan: Any,
    step_execution_fn: StepExecutionFn,
    *,
    poll_seconds: float = POLL_SECONDS,
) -> Iterator[dg.DagsterEvent]:
    """Send the plan's steps as they become ready, yield their events as they come back."""
    executor = job_context.executor
    if len(execution_plan.step_keys_to_execute) > 0 and not execution_plan.artifacts_persisted:
        raise dg.DagsterInvariantViolationError(
            "Cannot use in-memory storage with Celery, use filesystem (on top of NFS or "
            "similar system that allows files to be available to all nodes), S3, or GCS"
        )
    app = make_app(executor.app_args())  # type: ignore[no-untyped-call]
    default_priority = app.conf.task_default_priority
    default_queue = app.conf.task_default_queue
    run_priority: int = _get_run_priority(job_context)  # type: ignore[no-untyped-call]

    def priority_for_step(step: Any) -> float:
        step_priority = int(step.tags.get(DAGSTER_CELERY_STEP_PRIORITY_TAG, default_priority))
        return -1 * step_priority + -1 * run_priority

    def priority_for_key(step_key: str) -> float:
        return priority_for_step(execution_plan.get_step_by_key(step_key))

    _warn_on_priority_misuse(job_context, execution_plan)  # type: ignore[no-untyped-call]
    step_results: dict[str, Any] = {}  # step key -> its task's AsyncResult
    step_errors: dict[str, Any] = {}

    with (
        InstanceConcurrencyContext(
            job_context.instance, job_context.dagster_run
        ) as instance_concurrency_context,
        execution_plan.start(
            retry_mode=executor.retries,
            sort_key_fn=priority_for_step,
            instance_concurrency_context=instance_concurrency_context,
        ) as active_execution,
    ):
        stopping = False
        while (not active_execution.is_complete and not stopping) or step_results:
            if active_execution.check_for_interrupts():
                yield dg.DagsterEvent.engine_event(
                    job_context,
                    "Celery executor: received termination signal - revoking active tasks "
                    "from workers",
                    EngineEventData.interrupted(list(step_results.keys())),
                )
                stopping = True
                active_execution.mark_interrupted()
                for result in step_results.values():
                    result.revoke()
            done: list[str] = []
            for step_key, result in sorted(
                step_results.items(), key=lambda item: priority_for_key(item[0])
            ):
                if not result.ready():
                    continue
                step_events: list[Any] = []
                try:
                    step_events = result.get()
                except TaskRevokedError:
                    step = active_execution.get_step_by_key(step_key)
                    yield dg.DagsterEvent.engine_event(
                        job_context.for_step(step),
                        f'celery task for running step "{step_key}" was revoked.',
                        EngineEventData(marker_end=DELEGATE_MARKER),
                    )
                except Exception:
                    step_errors[step_key] = serializable_error_info_from_exc_info(sys.exc_info())
                for step_event in step_events:
                    event = dg.deserialize_value(step_event, dg.DagsterEvent)
                    yield event
                    active_execution.handle_event(event)
                done.append(step_key)
            for step_key in done:
                if step_key in step_results:
                    del step_results[step_key]
                    active_execution.verify_complete(job_context, step_key)

            # skips from failures or uncovered inputs
            yield from active_execution.plan_events_iterator(job_context)

            if stopping or step_errors:  # no new steps once stopping
                time.sleep(poll_seconds)
                continue

            for step in active_execution.get_steps_to_execute():
                try:
                    queue = step.tags.get(DAGSTER_CELERY_QUEUE_TAG, default_queue)
                    yield dg.DagsterEvent.engine_event(
                        job_context.for_step(step),
                        f'Submitting celery task for step "{step.key}" to queue "{queue}".',
                        EngineEventData(marker_start=DELEGATE_MARKER),
                    )
                    priority = _get_step_priority(  # type: ignore[no-untyped-call]
                        job_context, step, default_priority
                    )
                    step_results[step.key] = step_execution_fn(
                        app,
                        job_context,
                        step,
                        queue,
                        priority,
                        active_execution.get_known_state(),
                    )
                except Exception:
                    yield dg.DagsterEvent.engine_event(
                        job_context,
                        "Encountered error during celery task submission.",
                        event_specific_data=EngineEventData.engine_error(
                            serializable_error_info_from_exc_info(sys.exc_info()),
                        ),
                    )
                    raise
            time.sleep(poll_seconds)

        if step_errors:
            raise dg.DagsterSubprocessError(  # type: ignore[no-untyped-call]
                "During celery execution errors occurred in workers:\n{}".format(
                    "\n".join(f"[{key}]: {err.to_string()}" for key, err in step_errors.items())
                ),
                subprocess_error_infos=list(step_errors.values()),
            )
