"""After the claim: a failure recorded as the run's final word (owner-aware), the retry it
schedules, and once the row holds the result, recovery bookkeeping and a mutator's settle."""

import contextlib
from collections.abc import Iterator
from datetime import timedelta

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.decision_types import ResumeDecision
from pipeline_defs.resume.errors import ErrorCode, OwnershipLost, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.faults import crash_point
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.mutations import drop_written_ahead
from pipeline_defs.steps.mutator_edits import MutatorEdits
from pipeline_defs.steps.runner.outcome import OutcomeStatus, Published, StepOutcome
from pipeline_defs.steps.runner.run_info import RunInfo, audit_line
from pipeline_defs.steps.runner.writers import Writers
from resources.ledger.audit import AuditAction


class Bookkeeping:
    """The ledger bookkeeping of a run that holds its step's claim."""

    def __init__(self, judge: StepJudge, mutations: MutatorEdits, writers: Writers) -> None:
        self.judge = judge
        self.step = judge.step
        self.ledger = writers.ledger
        self.checkpoints = writers.checkpoints
        self.settings = judge.settings
        self.clock = judge.clock
        self.mutations = mutations

    @contextlib.contextmanager
    def failures_recorded(
        self, key: StepKey, run: RunInfo, decision: ResumeDecision, attempts: int
    ) -> Iterator[None]:
        """Record a failure of the enclosed work as this run's final word (owner-aware):
        only where the ledger does not hold one yet. A lost lease records nothing (the row
        is no longer ours)."""
        try:
            yield
        except BaseException as exc:
            if not isinstance(exc, OwnershipLost):
                self.record_failure(key, run, decision, exc, attempts)
            raise

    def record_failure(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        exc: BaseException,
        attempts: int,
    ) -> None:
        message = str(exc) or type(exc).__name__
        line = audit_line(
            run, decision, action=AuditAction.FAILED, from_status=StepStatus.RUNNING,
            to_status=StepStatus.FAILED, reason=message[:500],
        )  # fmt: skip
        failed = StepStatus.FAILED
        if self.ledger.transition(key, run.run_id, failed, error=message[:2000], audit=line):
            self.schedule_retry(key, run, attempts)

    def schedule_retry(self, key: StepKey, run: RunInfo, attempts: int) -> None:
        when = self.clock() + timedelta(seconds=attempts * self.settings.retry_backoff_seconds)
        self.ledger.set_retry_not_before(key, run.run_id, format_timestamp(when))

    def after_publish(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        attempts: int,
        published: Published,
    ) -> StepOutcome:
        """Recovery bookkeeping and a mutator's settle, once the row holds the result (and
        its history line, written with it by the runner's fenced publish)."""
        status = published.status
        # (6) recovery bookkeeping
        if status == StepStatus.COMPLETED:
            self.ledger.reset_recovery(key, run.run_id)
        elif status == StepStatus.FAILED:
            self.schedule_retry(key, run, attempts)
            raise PipelineError(
                ErrorCode.STEP_EXECUTE_FAILED, f"{key}: every item failed ({published.summary})"
            )
        # (7) a mutator settles its victims: a failed edit fails it (recorded)
        mutated = published.mutated
        if published.settle:
            with self.failures_recorded(key, run, decision, attempts):
                mutated = self.mutations.settle(
                    key,
                    published.settle,
                    published.checkpoint,
                    published.ctx,
                    run_id=run.run_id,
                    launch_path=run.launch_path,
                    reseal=status == StepStatus.COMPLETED,
                )
        if self.step.modifies_checkpoints:  # the row holds the result: the copy is spent
            drop_written_ahead(self.checkpoints, key)
        crash_point("finished", key.step_id)
        return StepOutcome(
            decision,
            OutcomeStatus.published(status),
            published.checkpoint,
            provider_calls=published.provider_calls,
            mutated=mutated,
            report=published.report,
            metadata=published.metadata,
        )
