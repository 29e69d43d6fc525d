"""Code location of ``tests/e2e/test_three_machines.py``: the shipped wiring on all ten steps.

The assets and resources are the ones ``build_defs`` makes for ``pipeline_defs.defs``; the
resume sensor ticks every second and starts STOPPED: the test turns it on (as an operator
would in the UI) once the CLI machines are done, so the kill and the resume of the CLI are
not raced by a sensor launch of the same steps (the ledger would keep that safe, but which
machine then did what could not be asserted).
"""

import dagster as dg

from pipeline_defs.definitions import build_defs
from pipeline_defs.storyboard import STORYBOARD_STEPS
from sensors.resume_sensor import build_resume_sensor

_shipped = build_defs(STORYBOARD_STEPS, sensor_interval_seconds=1)

defs = dg.Definitions(
    assets=_shipped.assets,
    sensors=[
        build_resume_sensor(
            STORYBOARD_STEPS,
            minimum_interval_seconds=1,
            default_status=dg.DefaultSensorStatus.STOPPED,
        )
    ],
    resources=_shipped.resources,
    executor=dg.in_process_executor,
)
