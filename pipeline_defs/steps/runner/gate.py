"""The upstream gate: a step runs only on settled upstream checkpoints nobody is re-running.

Reads only (the ledger rows and checkpoints of the step's deps, and a mutator dep's
judgement); a closed gate raises ``step.gate_blocked`` before any claim.
"""

from pipeline_defs.resume.decision_types import LaunchMode, ResumeAction
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from pipeline_defs.steps.judge import StepJudge

SETTLED_UPSTREAM = frozenset({StepStatus.COMPLETED, StepStatus.PARTIAL, StepStatus.NOT_APPLICABLE})
UNSETTLED_ROW = frozenset(
    {StepStatus.RUNNING, StepStatus.FAILED, StepStatus.STALE, StepStatus.PENDING}
)


def check_upstream(judge: StepJudge, key: StepKey) -> None:
    """Upstream checkpoints must be present and settled, and nobody re-running them."""
    step = judge.step
    rows = judge.ledger.get_many(episodes=[key.episode], step_ids=step.deps) if step.deps else {}
    for dep in step.deps:
        dep_key = StepKey(key.project_id, key.episode_id, dep)
        row = rows.get(dep_key)
        checkpoint, broken = judge.load_checkpoint(dep_key)
        problem = None
        if broken is not None:
            raise broken
        if checkpoint is None:
            problem = "has no checkpoint"
        elif checkpoint.status not in SETTLED_UPSTREAM:
            problem = f"checkpoint status is {checkpoint.status}"
        elif row is not None and row.status in UNSETTLED_ROW:
            problem = f"ledger status is {row.status}"
        elif judge.graph.step(dep).modifies_checkpoints:
            problem = mutator_pending(judge, dep_key, row)
        if problem:
            raise PipelineError(
                ErrorCode.STEP_GATE_BLOCKED,
                f"{key}: upstream {dep} {problem}; materialize it first",
                details={"upstream": dep},
            )


def mutator_pending(judge: StepJudge, key: StepKey, row: LedgerRow | None) -> str | None:
    """Why an upstream mutator (the review) must run before this step may read, or None.

    Its row can be ``completed`` while a victim changed under it (an accepted hand
    edit, a self-only re-run): the prompts it fixes are then unreviewed, and a step
    drawing from them now would spend on pictures the review would redo. The sensor
    waits on it (docs/DESIGN.md#review); a launch of this step alone waits too.
    """
    judged = judge.for_step(key.step_id).judge(key, mode=LaunchMode.RESUME, row=row)
    decision = judged.decision
    if decision.action in (ResumeAction.SKIP, ResumeAction.NOT_APPLICABLE):
        return None
    return (
        f"must run first ({decision.label}: {decision.reason}); "
        "its edits are not yet in what this step reads"
    )
