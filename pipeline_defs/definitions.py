"""The one place that builds the code location's ``Definitions``."""

from collections.abc import Sequence

import dagster as dg

from pipeline_defs.steps.assets import build_step_assets
from pipeline_defs.steps.spec import Step
from pipeline_defs.storyboard import STORYBOARD_STEPS, default_image_model, default_text_model
from resources.checkpoints.io_manager import CheckpointIOManager
from resources.pipeline import PipelineResource
from sensors.resume_sensor import DEFAULT_INTERVAL_SECONDS, build_resume_sensor


def build_resources(pipeline: PipelineResource | None = None) -> dict[str, object]:
    pipeline = pipeline or PipelineResource()
    return {
        "pipeline": pipeline,
        "checkpoint_io_manager": CheckpointIOManager(pipeline=pipeline),
        "text_model": default_text_model(),
        "image_model": default_image_model(),
    }


def build_defs(
    steps: Sequence[Step] = STORYBOARD_STEPS,
    pipeline: PipelineResource | None = None,
    *,
    sensor_interval_seconds: int = DEFAULT_INTERVAL_SECONDS,
) -> dg.Definitions:
    assets = build_step_assets(steps)
    return dg.Definitions(
        assets=assets,
        sensors=[build_resume_sensor(steps, minimum_interval_seconds=sensor_interval_seconds)],
        resources=build_resources(pipeline),
    )


defs = build_defs()
