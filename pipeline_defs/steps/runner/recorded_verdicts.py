"""The judge's verdicts that run nothing, recorded: a SKIP (or the adoption of a verified
orphan checkpoint), a BLOCK (raised), and a step not applicable to this partition."""

from pipeline_defs.resume.decision_types import (
    CODE_RECOVERY_EXHAUSTED,
    ResumeAction,
    ResumeDecision,
)
from pipeline_defs.resume.errors import BudgetExhausted, ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from pipeline_defs.resume.way_out import recovery_way_out
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.runner.outcome import OutcomeStatus, StepOutcome
from pipeline_defs.steps.runner.result_envelope import envelope
from pipeline_defs.steps.runner.run_info import RunInfo, audit_line
from pipeline_defs.steps.runner.writers import Writers
from pipeline_defs.steps.spec import StepResult
from resources.checkpoints.envelope import Checkpoint
from resources.ledger.audit import AuditAction


def skip(
    judge: StepJudge,
    writers: Writers,
    key: StepKey,
    run: RunInfo,
    decision: ResumeDecision,
    prior: str | None,
    checkpoint: Checkpoint | None,
) -> StepOutcome:
    """Row 4 adopts a verified orphan checkpoint; any other SKIP leaves a history line."""
    if not (decision.adopt and adopt(judge, writers, key, run, decision, checkpoint)):
        skipped = audit_line(
            run, decision, action=AuditAction.SKIP, from_status=prior, to_status=prior
        )
        writers.ledger.append_audit(key, skipped)
    return StepOutcome(decision, OutcomeStatus.SKIP, checkpoint)


def adopt(
    judge: StepJudge,
    writers: Writers,
    key: StepKey,
    run: RunInfo,
    decision: ResumeDecision,
    checkpoint: Checkpoint | None,
) -> bool:
    """Row 4: the orphan checkpoint was just verified clean; record it, sealed."""
    seal = (
        writers.checkpoints.seal(
            checkpoint,
            judge.verifier_reads(judge.context(key)),
            revision=judge.step.verify_revision,
        )
        if checkpoint is not None
        else None
    )
    line = audit_line(
        run, decision, action=AuditAction.ADOPT, from_status=None, to_status=StepStatus.COMPLETED
    )
    pointer = writers.checkpoints.adoptable_pointer(key)
    return writers.ledger.adopt(
        key, run.run_id, summary=decision.reason, seal=seal, pointer=pointer, audit=line
    )


def block(
    writers: Writers,
    key: StepKey,
    run: RunInfo,
    decision: ResumeDecision,
    row: LedgerRow | None,
) -> PipelineError:
    """Record a BLOCK; the error to raise (its code the decision's, the way out first)."""
    prior = row.status if row is not None else None
    blocked = audit_line(
        run, decision, action=AuditAction.BLOCK, from_status=prior, to_status=prior
    )
    writers.ledger.append_audit(key, blocked)
    message = f"{key}: {decision.reason}"
    if decision.code == CODE_RECOVERY_EXHAUSTED and row is not None:
        # The commands that get past it, as ``decide`` prints them; first, so that a
        # one-line view that clips the (long) reason still shows them whole.
        way_out = recovery_way_out(key, row.status, row.run_id, row.started_at)
        message = f"{key}: next: {way_out}; {decision.reason}"
    return PipelineError(
        decision.code or ErrorCode.STEP_RESUME_BLOCKED,
        message,
        origin=decision.origin.value if decision.origin else None,
        details={"decision": decision.action.value},
    )


def is_stop(error: PipelineError) -> bool:
    """Whether ``error`` is a stop that running the step again at once would meet again:
    the judge's BLOCK (raised by :func:`block`), or the spend cap refusing a call part way
    (``budget.exhausted``: the next judgement of the step is row 14's BLOCK). Dagster's
    run retries do not relaunch a run failed by one (docs/DESIGN.md#recovery-buttons).
    Nothing is judged here: the answer is the judge's, or the fact it would judge on."""
    blocked = error.details.get("decision") == ResumeAction.BLOCK.value
    return blocked or isinstance(error, BudgetExhausted)


def not_applicable(
    judge: StepJudge,
    writers: Writers,
    key: StepKey,
    run: RunInfo,
    decision: ResumeDecision,
    prior: str | None,
) -> StepOutcome:
    """The step has nothing to do for this partition: its row and an empty checkpoint say so."""
    line = audit_line(
        run, decision, action=AuditAction.NOT_APPLICABLE, from_status=prior,
        to_status=StepStatus.NOT_APPLICABLE,
    )  # fmt: skip
    if not writers.ledger.mark_not_applicable(key, run.run_id, decision.reason, audit=line):
        raise PipelineError(ErrorCode.STEP_ALREADY_RUNNING, f"{key}: another run owns this step")
    result = StepResult(data={}, applicable_count=0)
    project = judge.project(key)
    status = StepStatus.NOT_APPLICABLE
    checkpoint = envelope(judge.step, key, result, status, run, project, judge.clock)
    writers.checkpoints.save(
        checkpoint,
        fence=lambda staged: writers.ledger.publish(
            key, run.run_id, staged.commit, pointer=staged.pointer
        ),
    )
    return StepOutcome(decision, OutcomeStatus.NOT_APPLICABLE, checkpoint)
