"""The commands an operator runs to get out of a block, written in one place.

The judge decides; what the operator types to act on its decision is worded here, for the
CLI, the sensor's reports and the run's failure alike (docs/DESIGN.md#operator-words).
"""

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus


def recovery_way_out(
    key: StepKey, status: object, run_id: str | None, started_at: str | None
) -> str:
    """What an operator runs once the automatic recoveries of ``key`` are exhausted, each
    command whole, for its row's ``status``, ``run_id`` and ``started_at`` texts: the sensor
    launches nothing more, and a resume is refused until a success resets the count.

    A running row (its owner died, its lease lapsed) is reset first, compare-and-set on the
    ``started_at`` read here: a force never takes over a running row. Then a force rebuilds
    the step (it is not an automatic recovery, so the cap does not apply to it).
    """
    where = f"--partition {key.partition_key} --step {key.step_id}"
    force = (  # the launchpad tag for UI users, the command for the CLI
        f"launch it with tag resume/mode=force (storyboard force {where}); downstream "
        "checkpoints are invalidated"
    )
    if str(status) != StepStatus.RUNNING.value:
        return f"fix the cause of the repeated failures, then {force}"
    expected = (
        "--null-started-at" if started_at is None else f"--expected-started-at {started_at!r}"
    )
    return (
        f"its row is still held by run {run_id!r}, whose lease lapsed: release it with "
        f"storyboard reset-running {where} {expected}; then {force}"
    )
