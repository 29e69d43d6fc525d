"""The Celery fleet: the executor every launch path uses under ``PIPELINE_EXECUTOR=celery``
and the Celery app a ``storyboard worker`` serves (docs/DESIGN.md#fleet).

dagster-celery does the work: its executor sends each step to the broker as an
``execute_plan`` task that carries the run's ``instance_ref``, and a worker runs the step
against that instance (so the instance must be shared: PostgreSQL). What this module adds:

- the queue both sides use (``PIPELINE_CELERY_QUEUE``), so deployments and test runs can
  share one broker without taking each other's tasks;
- ``acks_late`` on the worker: a task is acknowledged when it ends, so a worker killed while
  running a step has its task delivered again to another worker. The step's ledger claim
  keeps that safe: the second delivery finds the row held by a live lease and is refused
  without a model call; once the lease lapses a later run recovers the step;
- a refusal, before the first step is sent, of a Dagster instance the workers cannot share
  (runs and events in SQLite under one machine's ``DAGSTER_HOME``);
- the worker's tasks behind a door (``fleet_tasks``): a run of another instance than the
  one the task opens fails ``fleet.instance_mismatch``, naming both;
- the coordinator's watch on its steps' queues (``fleet_queues``): a queue no worker
  consumes is warned about in the run's event log and, past
  ``PIPELINE_CELERY_QUEUE_WAIT_SECONDS``, fails the run with ``fleet.queue_unserved``.
"""

from collections.abc import Mapping
from typing import Any

import dagster as dg
from celery import Celery
from dagster_celery.executor import CeleryExecutor
from dagster_celery.make_app import make_app
from dagster_celery.tasks import create_execute_job_task, create_resume_job_task
from kombu.entity import Queue

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.fleet_settings import (
    BACKEND_ENV,
    BROKER_ENV,
    EXECUTOR_ENV,
    FleetSettings,
    masked,
)
from pipeline_defs.wiring.fleet_queues import FleetExecutor
from pipeline_defs.wiring.fleet_tasks import FleetTask, create_step_task
from pipeline_defs.wiring.run_lease import leased
from resources.pipeline import PipelineResource

# A step's task: acknowledged when it ends (see above); one task at a time per process.
WORKER_CONFIG: Mapping[str, Any] = {
    "task_acks_late": True,
    "worker_prefetch_multiplier": 1,
    "broker_connection_retry_on_startup": True,
}
SHARED_STORAGE_MODULES = ("dagster_postgres",)


def _config_source(settings: FleetSettings) -> dict[str, Any]:
    return {"task_default_queue": settings.queue, **WORKER_CONFIG}


def celery_app(settings: FleetSettings) -> Celery:
    """The app both sides build: the same broker, result backend and queue."""
    executor = CeleryExecutor.for_cli(  # type: ignore[no-untyped-call]
        broker=settings.broker_url,
        backend=settings.backend_url,
        config_source=_config_source(settings),
    )
    app: Celery = make_app(executor.app_args())  # type: ignore[no-untyped-call]
    # make_app declares only the "dagster" queue; declare ours the same way.
    app.conf.task_queues = [
        Queue(  # type: ignore[no-untyped-call]
            settings.queue,
            routing_key=f"{settings.queue}.#",
            queue_arguments={"x-max-priority": 10},
        )
    ]
    return app


def worker_app(settings: FleetSettings) -> Celery:
    """The app of ``storyboard worker``: dagster-celery's step task and, for a deployment
    whose run launcher is dagster-celery's ``CeleryRunLauncher`` (deploy/README.md), its run
    tasks. A run task is acknowledged when taken: delivered again after its worker died, it
    would start a second orchestration of a run already started. Each is dagster-celery's
    task on :class:`FleetTask` (a run of another instance fails typed, naming both); the
    step task keeps its Dagster instance per worker process (``create_step_task``)."""
    app = celery_app(settings)
    create_step_task(app, base=FleetTask)
    create_execute_job_task(app, acks_late=False, base=FleetTask)  # type: ignore[arg-type]
    create_resume_job_task(app, acks_late=False, base=FleetTask)  # type: ignore[arg-type]
    return app


def check_broker(app: Celery, settings: FleetSettings, timeout: float = 5.0) -> None:
    """Refuse now, naming the broker, when it cannot be reached."""
    try:
        with app.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=timeout)
    except Exception as exc:  # kombu raises the transport's own errors
        raise PipelineError(
            ErrorCode.FLEET_BROKER_UNREACHABLE,
            f"cannot reach the Celery broker {masked(settings.broker_url)} ({BROKER_ENV}): "
            f"{type(exc).__name__}: {exc}; start it (RabbitMQ: `rabbitmq-server -detached`) "
            f"or point {BROKER_ENV} at a running one",
        ) from None


def check_backend(app: Celery, settings: FleetSettings) -> None:
    """Refuse now, naming it, a result backend that cannot be reached (a step's events come
    back through it: a worker that cannot store them runs steps nobody sees end)."""
    client = getattr(app.backend, "client", None)  # the redis backend's connection pool
    if client is None:
        return
    try:
        client.ping()
    except Exception as exc:
        raise PipelineError(
            ErrorCode.FLEET_BROKER_UNREACHABLE,
            f"cannot reach the Celery result backend {masked(settings.backend_url)} "
            f"({BACKEND_ENV}): {type(exc).__name__}: {exc}; start it (Redis) or point "
            f"{BACKEND_ENV} at a running one",
        ) from None


def check_shared_instance(instance: dg.DagsterInstance) -> None:
    """Celery workers rebuild the run's instance from its reference: it must be shared."""
    storage = instance.get_ref().run_storage_data
    module = storage.module_name if storage is not None else "an unknown run storage"
    if not module.startswith(SHARED_STORAGE_MODULES):
        raise PipelineError(
            ErrorCode.FLEET_INSTANCE_NOT_SHARED,
            f"{EXECUTOR_ENV}=celery needs a Dagster instance the workers share, with its "
            f"runs and events in PostgreSQL (deploy/dagster.yaml); this instance keeps them "
            f"in {module} under one machine's DAGSTER_HOME",
        )


def build_executor(
    settings: FleetSettings, pipeline: PipelineResource | None = None
) -> dg.ExecutorDefinition:
    """The Definitions' executor, its coordinator holding the run's lease (``run_lease``):
    Dagster's default (a process per step) or, under ``PIPELINE_EXECUTOR=celery``, the fleet's."""
    inner = _celery_executor(settings) if settings.celery else dg.multi_or_in_process_executor
    return leased(inner, pipeline or PipelineResource())


def _celery_executor(settings: FleetSettings) -> dg.ExecutorDefinition:

    @dg.executor(
        name="celery",
        requirements=dg.multiple_process_executor_requirements(),
    )
    def storyboard_celery_executor(init_context: dg.InitExecutorContext) -> dg.Executor:
        check_shared_instance(init_context.instance)
        inner = CeleryExecutor.for_cli(  # type: ignore[no-untyped-call]
            broker=settings.broker_url,
            backend=settings.backend_url,
            config_source=_config_source(settings),
        )
        return FleetExecutor(inner, settings)

    return storyboard_celery_executor
