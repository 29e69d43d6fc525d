"""Code location of ``tests/e2e/test_fleet.py``: the shipped wiring on all ten steps, its
executor the fleet's (``PIPELINE_EXECUTOR=celery`` in the test's environment); the resume
sensor ticks every second and starts STOPPED: the test turns it on once the killed run has
ended, so that what recovers the killed step is the sensor's run, on the fleet."""

import dagster as dg

from pipeline_defs.definitions import build_defs
from pipeline_defs.resume.fleet_settings import FleetSettings
from pipeline_defs.storyboard import STORYBOARD_STEPS
from pipeline_defs.wiring.fleet import build_executor
from sensors.resume_sensor import build_resume_sensor

_shipped = build_defs(STORYBOARD_STEPS, sensor_interval_seconds=1)
_executor = build_executor(FleetSettings.from_env())  # its coordinators hold run leases

defs = dg.Definitions(
    assets=_shipped.assets,
    sensors=[
        build_resume_sensor(
            STORYBOARD_STEPS,
            minimum_interval_seconds=1,
            default_status=dg.DefaultSensorStatus.STOPPED,
            executor=_executor,
        )
    ],
    resources=_shipped.resources,
    executor=_executor,
)
