"""Code location of the launch-path tests: the real storyboard steps plus a racing probe.

The webserver loads ``defs`` (no sensor: a sensor running by default would launch runs of
its own in the middle of a test); the tests evaluate the real resume sensor from
``sensor_defs`` themselves. Runs use the in-process executor: one process per run instead
of one per step keeps forty-odd runs affordable on a two-core CI machine (the judge and
the claim are the same in either executor).
"""

import dagster as dg
from storyboard_fakes import Probe

from pipeline_defs.definitions import build_resources
from pipeline_defs.steps.spec import Step
from pipeline_defs.storyboard import STORYBOARD_STEPS
from pipeline_defs.wiring.assets import build_step_assets
from sensors.resume_sensor import build_resume_sensor


class StoryProbe(Probe):
    """The barrier probe, downstream of the real ``story_source``."""

    deps = ("story_source",)


STEPS: tuple[Step, ...] = (*STORYBOARD_STEPS, StoryProbe())

defs = dg.Definitions(
    assets=build_step_assets(STEPS),
    resources=build_resources(),
    executor=dg.in_process_executor,
)
sensor_defs = dg.Definitions(
    assets=build_step_assets(STEPS),
    sensors=[build_resume_sensor(STEPS, default_status=dg.DefaultSensorStatus.STOPPED)],
    resources=build_resources(),
    executor=dg.in_process_executor,
)
