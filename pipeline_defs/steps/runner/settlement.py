"""A mutator re-run that settles the edits its killed predecessor wrote ahead, instead of
reviewing again: no provider call, each fix applied exactly once (docs/DESIGN.md#write-ahead)."""

from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.faults import crash_point
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.mutator_edits import MutatorEdits
from pipeline_defs.steps.runner.outcome import Published
from pipeline_defs.steps.runner.run_info import RunInfo
from resources.checkpoints.envelope import Checkpoint

# The runner's fenced publish of a settled checkpoint as ``completed``: (checkpoint,
# summary, the seal's reads); raises ``step.ownership_lost`` when the row is no longer ours.
PublishCompleted = Callable[[Checkpoint, str, Sequence[Path]], None]


def settle_written_ahead(
    judge: StepJudge,
    mutations: MutatorEdits,
    key: StepKey,
    run: RunInfo,
    context: Callable[[], StepContext],
    publish: PublishCompleted,
) -> Published | None:
    """A mutator whose edits are written ahead but not all applied: apply them instead of
    reviewing again (no provider call). Either its checkpoint is published (the process
    died while settling), or the process died before publishing it: the
    written-ahead copy is published now and the runner's bookkeeping settles its edits, as
    the killed run would have. None when that is not possible (no intents, or a victim
    changed since): review again."""
    found = mutations.settlement(key, context)
    if found is None:
        return None
    reads = judge.verifier_reads(found.ctx)
    completed = StepStatus.COMPLETED
    if found.written_ahead:
        summary = (
            f"published the review written ahead by run "
            f"{found.checkpoint.produced_by.get('run_id')!r} (killed before it published); "
            "its edits are applied next, no provider call"
        )
        publish(found.checkpoint, summary, reads)
        crash_point("published", key.step_id)
        return Published(
            completed,
            found.checkpoint,
            summary,
            found.ctx,
            report=found.report,
            settle=found.intents,
        )
    mutated = mutations.settle(
        key,
        found.intents,
        found.checkpoint,
        found.ctx,
        run_id=run.run_id,
        launch_path=run.launch_path,
        reseal=False,
    )
    summary = f"settled the written-ahead edits of {', '.join(mutated) or 'no victim'}"
    publish(found.checkpoint, summary, reads)
    return Published(
        completed, found.checkpoint, summary, found.ctx, report=found.report, mutated=mutated
    )
