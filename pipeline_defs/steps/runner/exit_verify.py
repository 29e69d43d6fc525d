"""Exit verification: a ``completed`` result is verified before it is published; a result
that fails it is published ``partial``, and only a clean one is sealed."""

from dataclasses import dataclass
from pathlib import Path

from pipeline_defs.resume.completion import CompletionReport, Origin, report_from_exception
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.judge import StepJudge
from resources.checkpoints.envelope import Checkpoint


@dataclass(frozen=True)
class Verified:
    """What to publish after the exit verification: status, checkpoint, the report (None:
    not verified, the result was not ``completed``) and the seal's reads (None: no seal)."""

    status: StepStatus
    checkpoint: Checkpoint
    report: CompletionReport | None
    reads: tuple[Path, ...] | None


def exit_verify(
    judge: StepJudge, key: StepKey, ctx: StepContext, status: StepStatus, checkpoint: Checkpoint
) -> Verified:
    """Verify what a run is about to publish (only a ``completed`` result is verified)."""
    if status != StepStatus.COMPLETED:
        return Verified(status, checkpoint, None, None)
    try:
        report = judge.verify(ctx, checkpoint)
    except PipelineError as exc:  # a typed verdict (contract drift), not a crash
        report = report_from_exception(exc)
    except Exception as exc:
        raise PipelineError(
            ErrorCode.STEP_VERIFY_CRASHED,
            f"{key}: exit verification crashed: {type(exc).__name__}: {exc}",
            origin=Origin.VERIFY_CRASHED.value,
        ) from exc
    if not report.is_complete:
        partial = StepStatus.PARTIAL
        return Verified(partial, checkpoint.with_changes(status=partial), report, None)
    # A clean completed result is sealed: its files' identities go into the row, so a
    # read-only judge can trust this verification while they stay unchanged.
    return Verified(status, checkpoint, report, judge.verifier_reads(ctx))
