"""The tasks a ``storyboard worker`` serves: dagster-celery's, each behind a door of ours.

dagster-celery's step task (``execute_plan``) rebuilds the run's Dagster instance from the
reference the task carries and loads the run from it; its run tasks (``execute_job``,
``resume_job``, for ``CeleryRunLauncher``) load the run from the worker's own instance
(``DAGSTER_HOME``). A worker whose settings point at another instance than the launcher's
(another ``DAGSTER_PG_URL``, another ``dagster.yaml``) finds no such run, and dagster-celery
fails with an invariant of its own (``Could not load run ...``) that names neither instance.

:class:`FleetTask` is the base class those tasks are registered with (dagster-celery's task
factories take Celery's task options): the task runs unchanged, and only when it fails does
the door look, with the task's own arguments, whether the run is missing from the instance
the task opened; then the failure is ``fleet.instance_mismatch`` naming both instances (the
one the task carries, the worker's own), passwords masked, and what to do.

The step task is dagster-celery's, with what it rebuilt for every step kept per worker
process (:func:`create_step_task`): the Dagster instance of the reference the task carries is
opened once per process and holds a database connection between queries (dagster-postgres
opens one per query otherwise), where dagster-celery's task opened it again for each step
and never closed it (BENCHMARKS.md#the-fleet-steps-on-celery-workers). What the step reads
of its run (the run itself, its tags) is read from the database per task, as before.
"""

import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg
import yaml
from celery import Celery, Task
from dagster_celery.config import TASK_EXECUTE_PLAN_NAME
from dagster_celery.tasks import (  # type: ignore[attr-defined]  # what its own task uses
    DELEGATE_MARKER,
    CeleryExecutor,
    EngineEventData,
    ExecuteStepArgs,
    ReconstructableJob,
    create_execution_plan,
    execute_plan_iterator,
    unpack_value,
)

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.fleet_settings import masked

STEP_TASK = "execute_plan"  # dagster-celery's step task: the instance its reference names
# The packed arguments of dagster-celery's tasks (serdes dicts), by class name.
PACKED_ARGS = ("ExecuteStepArgs", "ExecuteRunArgs", "ResumeRunArgs")
# ``scheme://user:password@``: the password, wherever a URL sits in a text.
_PASSWORD = re.compile(r"(://[^/\s:@]*:)[^@\s/]*@")
# A worker process's instances hold one connection each, more while a step writes from a
# second thread; one that idled this long is opened again.
POOL_RECYCLE_SECONDS = 300
POOL_MAX_OVERFLOW = 4

_instances: dict[str, dg.DagsterInstance] = {}  # this process's, by their reference
_instances_lock = threading.Lock()


def scrub(text: str) -> str:
    """``text`` with the password of every URL in it replaced."""
    return _PASSWORD.sub(r"\1***@", text)


class RemotePipelineError(PipelineError):
    """A :class:`PipelineError` that crosses Celery's result backend whole: Celery rebuilds a
    task's exception from its arguments, here the one text ``[code] message``, so the run's
    coordinator gets the typed error back (not a bare ``Exception`` holding its repr)."""

    def __init__(self, text: str) -> None:
        code, _, message = text.partition("] ")
        super().__init__(code.removeprefix("["), message)

    @classmethod
    def of(cls, error: PipelineError) -> "RemotePipelineError":
        remote = cls(str(error))
        remote.details = dict(error.details)
        return remote


class FleetTask(Task):  # type: ignore[misc]  # celery's Task is untyped
    """Base of the worker's dagster-celery tasks: the task as it is, its failure explained
    when the run it serves is not in the instance it opened."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The worker's tracer has pushed this task's request (hostname, id) already; ``run``
        # is called as Celery calls it, so the task reads the same request.
        try:
            return self.run(*args, **kwargs)
        except Exception as exc:
            problem = instance_mismatch(
                str(self.name), self.request.hostname, [*args, *kwargs.values()]
            )
            if problem is None:
                raise
            raise RemotePipelineError.of(problem) from exc


def worker_instance(ref: Any) -> dg.DagsterInstance:
    """The instance ``ref`` names, opened once in this worker process and kept: its storages
    hold a connection each instead of opening one per query."""
    key = dg.serialize_value(ref)
    with _instances_lock:
        instance = _instances.get(key)
        if instance is None:
            instance = dg.DagsterInstance.from_ref(ref)
            # dagster-postgres's pooled engine, as its webserver uses (no statement timeout:
            # a step's writes are not a page's reads).
            instance.optimize_for_webserver(
                statement_timeout=0,
                pool_recycle=POOL_RECYCLE_SECONDS,
                max_overflow=POOL_MAX_OVERFLOW,
            )
            _instances[key] = instance
        return instance


def close_worker_instances() -> None:
    """Close the instances this process kept (a worker process ending, a test)."""
    with _instances_lock:
        kept = list(_instances.values())
        _instances.clear()
    for instance in kept:
        instance.dispose()


def create_step_task(app: Celery, **task_kwargs: Any) -> Any:
    """dagster-celery's ``execute_plan`` task (``dagster_celery.tasks.create_task``), the same
    steps in the same order, on the process's kept instance (:func:`worker_instance`)."""

    @app.task(bind=True, name=TASK_EXECUTE_PLAN_NAME, **task_kwargs)  # type: ignore[untyped-decorator]
    def _execute_plan(
        self: Any, execute_step_args_packed: dict[str, Any], executable_dict: dict[str, Any]
    ) -> list[str]:
        args = unpack_value(execute_step_args_packed, as_type=ExecuteStepArgs)
        instance = worker_instance(args.instance_ref)
        recon_job = ReconstructableJob.from_dict(executable_dict)
        dagster_run = instance.get_run_by_id(args.run_id)
        if dagster_run is None:
            raise dg.DagsterInvariantViolationError(f"Could not load run {args.run_id}")
        step_keys_str = ", ".join(args.step_keys_to_execute or [])
        execution_plan = create_execution_plan(
            recon_job,
            dagster_run.run_config,
            step_keys_to_execute=args.step_keys_to_execute,
            known_state=args.known_state,
        )
        step_handle = execution_plan.step_handle_for_single_step_plans()
        engine_event = instance.report_engine_event(
            f"Executing steps {step_keys_str} in celery worker",
            dagster_run,
            EngineEventData(
                {"step_keys": step_keys_str, "Celery worker": self.request.hostname},
                marker_end=DELEGATE_MARKER,
            ),
            CeleryExecutor,
            step_key=step_handle.to_key() if step_handle is not None else None,
        )
        events = [engine_event]
        events.extend(
            execute_plan_iterator(
                execution_plan=execution_plan,
                job=recon_job,
                dagster_run=dagster_run,
                instance=instance,
                retry_mode=args.retry_mode,
                run_config=dagster_run.run_config,
            )
        )
        return [dg.serialize_value(event) for event in events]

    return _execute_plan


def instance_mismatch(
    task: str,
    worker: str | None,
    arguments: Iterable[Any],
    env: Mapping[str, str] | None = None,
) -> PipelineError | None:
    """``fleet.instance_mismatch`` when the run the task's arguments name is not in the
    instance the task opens (the one its reference names for a step, the worker's own for a
    run task); None when it is, or when that cannot be told (the failure is another one)."""
    source = os.environ if env is None else env
    packed = next(
        (a for a in arguments if isinstance(a, dict) and a.get("__class__") in PACKED_ARGS),
        None,
    )
    if packed is None:
        return None
    try:  # as dagster-celery unpacks them (their stored field names are their own)
        unpacked: Any = dg.deserialize_value(json.dumps(packed))
        run_id, carried = str(unpacked.run_id), unpacked.instance_ref
    except Exception:
        return None
    if carried is None:
        return None
    opened_from_ref = task == STEP_TASK
    try:
        instance = dg.DagsterInstance.from_ref(carried) if opened_from_ref else _own_instance()
    except Exception:
        return None  # it does not open: not this door's case, the task's error says why
    try:
        if instance.get_run_by_id(run_id) is not None:
            return None
    except Exception:
        return None
    finally:
        instance.dispose()
    theirs = describe_ref(carried, source)
    ours = describe_own(source)
    opened = (
        "the instance the task carries, opened with this worker's settings"
        if opened_from_ref
        else "this worker's own instance (run tasks use it)"
    )
    return PipelineError(
        ErrorCode.FLEET_INSTANCE_MISMATCH,
        f"worker {worker or 'this worker'} was handed task {task} of run {run_id}, which "
        f"belongs to another Dagster instance: the run is not in {opened}. "
        f"The run's instance, as the task carries it (its launcher's): {theirs}. "
        f"This worker's own instance: {ours}. Point the launcher (daemon, code server, "
        "storyboard materialize) and every storyboard worker at the same Dagster instance: "
        "the same dagster.yaml in DAGSTER_HOME (the shipped deploy/dagster.yaml) and the "
        "same DAGSTER_PG_URL",
        details={"run_id": run_id, "task": task},
    )


def _own_instance() -> dg.DagsterInstance:
    return dg.DagsterInstance.get()


def describe_ref(ref: Any, env: Mapping[str, str]) -> str:
    """An instance reference in words: its home and where its runs are (``{env: X}`` values
    named by variable, with what that variable holds here), passwords masked."""
    home = _config(getattr(ref, "local_artifact_storage_data", None)).get("base_dir")
    where = f"DAGSTER_HOME {_text(home, env)}" if home is not None else "no DAGSTER_HOME"
    return f"{where}, runs in {describe_storage(getattr(ref, 'run_storage_data', None), env)}"


def describe_own(env: Mapping[str, str]) -> str:
    """This process's own instance (``DAGSTER_HOME``) in words."""
    home = env.get("DAGSTER_HOME", "")
    if not home:
        return "none (DAGSTER_HOME is not set on this worker)"
    try:
        with dg.DagsterInstance.get() as instance:
            return describe_ref(instance.get_ref(), env)
    except Exception as exc:
        return f"DAGSTER_HOME {home}, which does not load here ({scrub(f'{exc}')[:300]})"


def describe_storage(data: Any, env: Mapping[str, str]) -> str:
    """A run storage's configured class and location (URL, database or directory)."""
    if data is None:
        return "an unknown run storage"
    kind = f"{data.module_name}.{data.class_name}"
    config = _config(data)
    for key in ("postgres_url", "mysql_url"):
        if key in config:
            return f"{kind} at {_text(config[key], env)}"
    for key in ("postgres_db", "mysql_db"):
        db = config.get(key)
        if isinstance(db, dict):
            host, name = _text(db.get("hostname"), env), _text(db.get("db_name"), env)
            return f"{kind} at {host}/{name}"
    if "base_dir" in config:
        return f"{kind} under {_text(config['base_dir'], env)}"
    return kind


def _config(data: Any) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(getattr(data, "config_yaml", "") or "")
    except yaml.YAMLError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _text(value: Any, env: Mapping[str, str]) -> str:
    """A config value: a literal (masked), or ``{env: X}`` as the variable and its value here."""
    if isinstance(value, dict) and "env" in value:
        name = str(value["env"])
        here = env.get(name, "")
        return f"${name} (here {masked(here)})" if here else f"${name} (not set here)"
    return scrub(masked(str(value)))
