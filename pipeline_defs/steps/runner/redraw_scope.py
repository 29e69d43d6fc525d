"""A redraw launch, per step: the items of this step it redraws (resolved before the
claim), and, once drawn, the downstream items built from them (run metadata)."""

import dataclasses

from pipeline_defs.resume.decision_types import LaunchMode
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.redraw import dependents_of, resolve_targets
from pipeline_defs.steps.runner.outcome import StepOutcome
from pipeline_defs.steps.runner.run_info import RunInfo
from resources.checkpoints.envelope import Checkpoint


def resolve_redraw(judge: StepJudge, key: StepKey, run: RunInfo) -> RunInfo:
    """This step's redraw targets; a run asking for none of its items resumes as usual."""
    assert run.redraw is not None
    if run.mode is LaunchMode.FORCE:
        raise PipelineError(
            ErrorCode.REDRAW_INVALID, f"{key}: a launch is a force or a redraw, not both"
        )

    def load(step_id: str) -> Checkpoint | None:
        return judge.checkpoints.load(StepKey(key.project_id, key.episode_id, step_id))

    steps = judge.graph.declared
    targets = resolve_targets(judge.step, key, run.redraw, load, steps)
    mode = LaunchMode.REDRAW if targets else LaunchMode.RESUME
    return dataclasses.replace(run, mode=mode, redraw_items=targets)


def report_dependents(
    judge: StepJudge, key: StepKey, run: RunInfo, outcome: StepOutcome
) -> StepOutcome:
    """Name the downstream items built from what was just redrawn (run metadata)."""

    def load(step_id: str) -> Checkpoint | None:
        found, _broken = judge.load_checkpoint(StepKey(key.project_id, key.episode_id, step_id))
        return found

    steps = judge.graph.declared
    found = dependents_of(steps, load, key.step_id, sorted(run.redraw_items))
    text = "; ".join(f"{step}: {', '.join(items)}" for step, items in found.items())
    follow = bool(run.redraw and run.redraw.with_dependents)
    metadata = {
        **outcome.metadata,
        "redraw_items": ", ".join(sorted(run.redraw_items)),
        "redraw_dependents": text or "none",
        "redraw_dependents_count": sum(len(i) for i in found.values()),
        "redraw_dependents_follow": follow,
    }
    return dataclasses.replace(outcome, metadata=metadata)
