"""PLACEHOLDER — replaced by the resume sensor (issue 5)."""

from collections.abc import Sequence

import dagster as dg

from pipeline_defs.steps.spec import Step


def build_resume_sensor(steps: Sequence[Step]) -> dg.SensorDefinition:
    @dg.sensor(name="resume_sensor")
    def resume_sensor(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        return dg.SkipReason("not implemented yet")

    return resume_sensor
