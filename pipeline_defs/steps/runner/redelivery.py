"""A delivery fenced out by a redelivery of its own task (docs/DESIGN.md#claim-tokens).

The broker delivers a task again when its worker's connection drops (a pause, a network
cut) while the first delivery may still be alive. Both belong to the same run; each claimed
with a token of its own, so the one whose claim was taken over makes no call and writes
nothing (``step.ownership_lost``). Its result still reaches the run's coordinator, which may
read it before the redelivery's: a failure there would fail the run of a step its other
delivery completed. So the fenced delivery waits, without writing, for the claim of its own
run to settle, and reports what that claim published as a SKIP of this delivery: the run
goes on with the very checkpoint the winner published. Anything else (another run took the
row, the winner's lease lapsed, it failed, the result does not judge clean) is the original
``step.ownership_lost``.
"""

import time
from collections.abc import Callable
from datetime import timedelta

from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.decision_types import LaunchMode, ResumeAction
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.runner.outcome import OutcomeStatus, StepOutcome
from pipeline_defs.steps.runner.run_info import RunInfo, run_token_of

_SETTLED = (StepStatus.COMPLETED, StepStatus.PARTIAL)


def redelivered_outcome(
    judge: StepJudge,
    key: StepKey,
    run: RunInfo,
    lost: PipelineError,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> StepOutcome:
    """The outcome the claim of ``run``'s own redelivery published; else raise ``lost``.

    Reads only. Waits while that claim is running and alive by the lease rules (its
    heartbeat younger than ``lease_seconds``), polling at the heartbeat's pace (at most 1 s).
    """
    settings = judge.settings
    pause = min(1.0, settings.heartbeat_seconds)
    lease = timedelta(seconds=settings.lease_seconds)
    while True:
        row = judge.ledger.get(key)
        if row is None or row.run_id is None or run_token_of(row.run_id) != run.run_id:
            raise lost  # another run's claim, or no claim: not a redelivery of this task
        if row.status in _SETTLED:
            break
        if row.status is not StepStatus.RUNNING:
            raise lost
        beat = parse_timestamp(row.heartbeat_at or row.started_at)
        if beat is None or judge.clock() - beat > lease:
            raise lost  # the redelivery stopped proving it is alive: the lease rules decide
        sleep(pause)
    judgement = judge.judge(key, mode=LaunchMode.RESUME, row=row)
    decision = judgement.decision
    if decision.action is not ResumeAction.SKIP or judgement.checkpoint is None:
        raise lost
    judge.log.warning(
        "%s: this delivery's claim was taken over by a delivery of the same run (%s), which "
        "published; its checkpoint is this step's output here (no call, nothing written)",
        key,
        row.run_id,
    )
    return StepOutcome(decision, OutcomeStatus.SKIP, judgement.checkpoint)
