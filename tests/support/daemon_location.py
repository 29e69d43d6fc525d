"""Code locations of the daemon-path sensor tests: the shipped wiring on real steps.

Built by ``build_defs`` exactly as ``pipeline_defs.defs`` is, the resume sensor ticking
every second and runs in one process each (cheaper on a two-core CI machine; the judge and
the claim are the same in either executor): ``defs`` with the first two storyboard steps,
``storyboard_defs`` with all ten.
"""

import dagster as dg

from pipeline_defs.definitions import build_defs
from pipeline_defs.storyboard import STORYBOARD_STEPS

STEPS = STORYBOARD_STEPS[:2]  # story_source, entity_canon

defs = build_defs(STEPS, sensor_interval_seconds=1, executor=dg.in_process_executor)

storyboard_defs = build_defs(
    STORYBOARD_STEPS, sensor_interval_seconds=1, executor=dg.in_process_executor
)
