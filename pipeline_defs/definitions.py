"""The one place that builds the code location's ``Definitions``."""

from collections.abc import Sequence

import dagster as dg

from pipeline_defs.resume.fleet_settings import FleetSettings
from pipeline_defs.resume.settings import check_environment
from pipeline_defs.steps.spec import Step
from pipeline_defs.storyboard import STORYBOARD_STEPS
from pipeline_defs.storyboard.providers import model_routers
from pipeline_defs.wiring.assets import build_step_assets
from pipeline_defs.wiring.fleet import build_executor
from pipeline_defs.wiring.instance_storage import check_dagster_storage
from pipeline_defs.wiring.io_manager import CheckpointIOManager
from pipeline_defs.wiring.run_lease import leased
from resources.pipeline import PipelineResource
from resources.providers.base import MODEL_KINDS
from sensors.resume_sensor import DEFAULT_INTERVAL_SECONDS, build_resume_sensor
from sensors.storage_gc import storage_gc, storage_gc_daily


def build_resources(pipeline: PipelineResource | None = None) -> dict[str, object]:
    pipeline = pipeline or PipelineResource()
    return {
        "pipeline": pipeline,
        "checkpoint_io_manager": CheckpointIOManager(pipeline=pipeline),
        # Routers, one per kind of model: each step run calls the models its project's
        # provider section names.
        **{kind.resource_key: model_routers()[kind.name] for kind in MODEL_KINDS},
    }


def build_defs(
    steps: Sequence[Step] = STORYBOARD_STEPS,
    pipeline: PipelineResource | None = None,
    *,
    sensor_interval_seconds: int = DEFAULT_INTERVAL_SECONDS,
    executor: dg.ExecutorDefinition | None = None,
) -> dg.Definitions:
    """The code location. A bad ``PIPELINE_*`` variable refuses it here, naming the variable.

    This is the one read of the environment while the module is imported (``defs`` below):
    Dagster loads a code location by importing it, so load time is import time, and a bad
    limit must fail the location's load, not its first run or sensor tick. It reads
    variables and the Dagster instance's ``dagster.yaml`` only (a PostgreSQL storage
    SQLAlchemy would open with psycopg 3 is refused, ``wiring/instance_storage.py``); no
    database is reached (the ledger's settings table is read per tick and per run).
    """
    check_environment()
    check_dagster_storage()
    pipeline = pipeline or PipelineResource()
    # PIPELINE_EXECUTOR=celery: every launch path's steps run on the fleet (docs/DESIGN.md#fleet);
    # either way a run's coordinator holds its run lease (docs/DESIGN.md#run-leases).
    # ``executor``: a test location's own (in one process), leased the same way.
    executor = (
        leased(executor, pipeline)
        if executor is not None
        else build_executor(FleetSettings.from_env(), pipeline)
    )
    assets = build_step_assets(steps)
    return dg.Definitions(
        assets=assets,
        sensors=[
            build_resume_sensor(
                steps, minimum_interval_seconds=sensor_interval_seconds, executor=executor
            )
        ],
        jobs=[storage_gc],
        schedules=[storage_gc_daily],
        resources=build_resources(pipeline),
        executor=executor,
    )


defs = build_defs()
