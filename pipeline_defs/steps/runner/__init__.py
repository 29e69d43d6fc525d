"""The run protocol every step execution follows, written once.

gate → applicability → judge (``steps.judge``: reads only) → SKIP / BLOCK / claim →
(force: cleanup and invalidate downstream) → finalize: execute, status, exit verify,
owner-aware status + fenced publish, recovery bookkeeping, mutator hook
(``steps.mutations``). Any failure between the claim and the publish records an
owner-aware ``failed`` and re-raises. Dagster-free: the asset factory adapts it.

:class:`StepRunner` holds the sequence and the writes that need the row's lock (the claim
and the fenced publish); each other concern is a module of this package:

- ``writers``: the full stores a run writes with (:class:`Writers`; the judge holds only
  their readers);
- ``run_info``: who runs (:class:`RunInfo`) and the history line of its judgement;
- ``outcome``: what a run ends with (:class:`StepOutcome`, :class:`Published`);
- ``gate``: upstream settled before anything is judged;
- ``redraw_scope``: a redraw's targets for this step, and their dependents afterwards;
- ``recorded_verdicts``: SKIP / adopt, BLOCK, not applicable (no claim, nothing executed);
- ``claim``: the attempt a claim counts as, and why a refused one lost;
- ``redelivery``: a delivery fenced out by a redelivery of its own task takes its outcome;
- ``force``: an explicit force's cleanup and downstream invalidation;
- ``execute`` (+ ``envelope``, ``exit_verify``): the step body, up to a verified result;
- ``settlement``: a mutator's written-ahead edits settled with no provider call;
- ``bookkeeping``: failures recorded, retries scheduled, recovery reset, victims settled.
"""

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline_defs.project import ProjectConfig
from pipeline_defs.resume.decision_types import ResumeAction, ResumeDecision
from pipeline_defs.resume.errors import ErrorCode, OwnershipLost, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from pipeline_defs.steps.context import ProviderMeter, StepContext
from pipeline_defs.steps.faults import crash_point
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.lease import Lease
from pipeline_defs.steps.mutations import write_ahead
from pipeline_defs.steps.mutator_edits import MutatorEdits
from pipeline_defs.steps.runner import recorded_verdicts
from pipeline_defs.steps.runner.bookkeeping import Bookkeeping
from pipeline_defs.steps.runner.claim import attempts_of, lease_hint
from pipeline_defs.steps.runner.execute import execute
from pipeline_defs.steps.runner.force import force_cleanup, invalidate_downstream
from pipeline_defs.steps.runner.gate import check_upstream
from pipeline_defs.steps.runner.outcome import OutcomeStatus, Published, StepOutcome
from pipeline_defs.steps.runner.redelivery import redelivered_outcome
from pipeline_defs.steps.runner.redraw_scope import report_dependents, resolve_redraw
from pipeline_defs.steps.runner.run_info import RunInfo, audit_line
from pipeline_defs.steps.runner.settlement import settle_written_ahead
from pipeline_defs.steps.runner.writers import Writers
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.store import CheckpointStore
from resources.ledger.audit import AuditAction
from resources.ledger.store import LedgerStore
from resources.providers.base import MODEL_KINDS, Model

__all__ = ["OutcomeStatus", "Published", "RunInfo", "StepOutcome", "StepRunner", "Writers"]


class StepRunner:
    """Runs one step for a partition: the only writer of its row, checkpoint and audit.

    ``judge`` reads (it holds the stores' readers only); ``ledger`` and ``checkpoints`` are
    the full stores this run writes with, the same ones the judge reads.
    """

    def __init__(
        self,
        judge: StepJudge,
        *,
        ledger: LedgerStore,
        checkpoints: CheckpointStore,
        models: Mapping[str, Model] | None = None,
        on_takeover: Callable[[str, str], None] | None = None,
    ) -> None:
        # ``on_takeover(previous owner, reason)``: called once this run has taken a lapsed
        # lease over (the row is ours; the previous owner is fenced for good), so the wiring
        # can end that owner's run where it is tracked (a killed worker's Dagster run would
        # otherwise stay "started", holding its episode's queue slot).
        self.on_takeover = on_takeover
        self.judge = judge
        self.step = judge.step
        self.settings = judge.settings
        self.writers = Writers(ledger, checkpoints)
        self.ledger = ledger
        self.checkpoints = checkpoints
        self.log = judge.log
        self.clock = judge.clock
        # The code location's model resources by kind name (``MODEL_KINDS``): each routes
        # to the model a project's ``provider:`` section asks for.
        self.model_resources: Mapping[str, Model] = dict(models or {})
        self.mutations = MutatorEdits(
            judge, ledger=self.ledger, checkpoints=self.checkpoints, clock=self.clock
        )
        self.bookkeeping = Bookkeeping(judge, self.mutations, self.writers)

    # ------------------------------------------------------------------ helpers
    def context(
        self,
        key: StepKey,
        *,
        run_id: str,
        meter: ProviderMeter | None = None,
        redraw: frozenset[str] = frozenset(),
    ) -> StepContext:
        """The judge's context, owned by this run (and its providers, when metered)."""
        return self.writers.context(self.judge, key, run_id=run_id, meter=meter, redraw=redraw)

    def models(self, project: ProjectConfig) -> dict[str, Model]:
        """The models this project's ``provider:`` section asks for, by kind, checked ready
        to call (config, key): a typed ``provider.*`` error here comes before any claim or
        call. Only the kinds this step calls need a key (story_source: none)."""
        found: dict[str, Model] = {}
        for kind in MODEL_KINDS:
            resource = self.model_resources.get(kind.name)
            if resource is None:
                continue
            model: Model = resource.for_provider(project.provider)
            if kind.called_by(self.step.resume_config_keys):
                model.preflight()
            found[kind.name] = model
        return found

    # ------------------------------------------------------------------ running
    def gate(self, key: StepKey) -> None:
        """Upstream checkpoints must be present and settled, and nobody re-running them."""
        check_upstream(self.judge, key)

    def run(
        self, partition_key: str, run: RunInfo, inputs: Mapping[str, Checkpoint | None]
    ) -> StepOutcome:
        key = self.judge.key(partition_key)
        self.checkpoints.sync_inputs(key.project_id, key.episode_id)  # object storage
        self.gate(key)
        if run.redraw is not None:  # unknown ids fail here: before the claim, nothing changed
            run = resolve_redraw(self.judge, key, run)
        row = self.ledger.get(key)
        judgement = self.judge.judge(key, mode=run.mode, row=row)
        decision = judgement.decision
        prior = row.status if row is not None else None

        if decision.action is ResumeAction.NOT_APPLICABLE:
            return recorded_verdicts.not_applicable(
                self.judge, self.writers, key, run, decision, prior
            )
        if decision.action is ResumeAction.SKIP:
            checkpoint = judgement.checkpoint
            return recorded_verdicts.skip(
                self.judge, self.writers, key, run, decision, prior, checkpoint
            )
        if decision.action is ResumeAction.BLOCK:
            raise recorded_verdicts.block(self.writers, key, run, decision, row)
        # no key or a bad provider fails here, before the claim and any call,
        # and only for a step that will run (a SKIP or a BLOCK calls no model).
        self.models(self.judge.project(key))
        try:
            outcome = self._claim_and_finalize(key, run, decision, row, inputs)
        except OwnershipLost as error:
            outcome = redelivered_outcome(self.judge, key, run, error)
        if run.redraw_items:
            outcome = report_dependents(self.judge, key, run, outcome)
        return outcome

    def _claim_and_finalize(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        row: LedgerRow | None,
        inputs: Mapping[str, Checkpoint | None],
    ) -> StepOutcome:
        stale = decision.action is ResumeAction.STALE_RUNNING_RECOVERY
        # The claim's own fencing token (docs/DESIGN.md#claim-tokens): from here on every
        # owner check (lease, call records, transitions, publish) compares this one, so a
        # redelivery of this very task that takes the row over fences this delivery out.
        run = run.claiming()
        # Row 12 counts automatic recoveries: the sensor's. An operator's launch of the same
        # decision takes the row over uncounted, leaving the count and last reason as the
        # sensor's recoveries left them (visible in ``status``).
        counted = decision.auto_recovery and run.automatic
        line = audit_line(
            run,
            decision,
            action=AuditAction(decision.action.value),  # a claiming verdict, as recorded
            from_status=row.status if row is not None else None,
            to_status=StepStatus.RUNNING,
        )
        won = self.ledger.claim(
            key,
            run.run_id,
            allow_stale_steal=stale,
            expected_started_at=decision.expected_started_at,
            expected_run_id=decision.expected_run_id,
            expected_heartbeat_at=decision.expected_heartbeat_at,
            auto_recovery=counted,
            # A force or a redraw asks for new replies: none paid for earlier is taken back.
            fresh=decision.action in (ResumeAction.FORCE_EXPLICIT, ResumeAction.REDRAW_EXPLICIT),
            reason=decision.reason,
            seen=row,
            audit=line,
            refused=line.refused(AuditAction.CLAIM_REJECTED, decision.reason),
        )
        if won and stale and decision.expected_run_id and self.on_takeover is not None:
            try:
                self.on_takeover(
                    decision.expected_run_id,
                    f"its lease on {key} lapsed and run {run.run_id} took the step over",
                )
            except Exception as exc:  # bookkeeping of another run: never this run's failure
                self.log.warning("%s: could not end the previous owner's run: %s", key, exc)
        if not won:
            hint = lease_hint(key, row, self.settings, self.clock())
            raise PipelineError(
                ErrorCode.STEP_ALREADY_RUNNING,
                f"{key}: another run owns this step or changed it since it was judged "
                f"(claim for {decision.action.value} refused){hint}",
            )
        attempts = attempts_of(row, counted=counted)
        lease = Lease(
            self.ledger,
            key,
            run.run_id,
            interval_seconds=self.settings.heartbeat_seconds,
            log=self.log,
        )
        with lease:
            # From here on the row is ours: until this run's final word is published, any
            # failure must be recorded, never left running.
            with self.bookkeeping.failures_recorded(key, run, decision, attempts):
                crash_point("claimed", key.step_id)
                force = decision.action is ResumeAction.FORCE_EXPLICIT
                if force:
                    force_cleanup(self.judge, key, self.context(key, run_id=run.run_id))
                    invalidate_downstream(self.judge, self.writers, key, run)
                # a mutator whose published edits were cut short settles them, no provider call
                published = (
                    self._settle_published(key, run, decision)
                    if self.step.modifies_checkpoints and not force
                    else None
                )
                if published is None:
                    published = self._execute_and_publish(key, run, decision, inputs, lease)
            return self.bookkeeping.after_publish(key, run, decision, attempts, published)

    def _execute_and_publish(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        inputs: Mapping[str, Checkpoint | None],
        lease: Lease,
    ) -> Published:
        models = self.models(self.judge.project(key))
        done = execute(
            self.judge, self.writers, self.mutations, key, run, inputs, lease=lease, models=models
        )
        # (4)+(5) owner-aware status and fenced publish, one transaction
        lease.check()  # a lost lease publishes nothing (the owner-aware update would refuse)
        if done.edits and done.status != StepStatus.FAILED:
            # Under the row lock of a row still ours, like a publish: a worker whose lease
            # was taken (its lease thread not yet aware, as after a pause) writes nothing
            # ahead, where it would replace the new owner's edits.
            self.ledger.publish(
                key,
                run.run_id,
                lambda: write_ahead(self.checkpoints, key, done.edits, done.checkpoint),
            )
        published = self._publish(
            key,
            run,
            decision,
            done.status,
            done.checkpoint,
            done.summary,
            done.counts,
            done.reads,
            done.meter.resolved_model,
        )
        crash_point("published", key.step_id)
        if not published:
            raise self._ownership_lost(key, run)
        return Published(
            done.status,
            done.checkpoint,
            done.summary,
            done.ctx,
            report=done.report,
            provider_calls=done.meter.calls,
            metadata=done.metadata,
            settle=tuple(e.intent for e in done.edits),
        )

    def _settle_published(
        self, key: StepKey, run: RunInfo, decision: ResumeDecision
    ) -> Published | None:
        """A mutator's edits written ahead by a killed run, settled with no provider call
        (``settlement``); None: review again."""

        def publish(checkpoint: Checkpoint, summary: str, reads: Sequence[Path]) -> None:
            completed = StepStatus.COMPLETED
            if not self._publish(key, run, decision, completed, checkpoint, summary, {}, reads):
                raise self._ownership_lost(key, run)

        def context() -> StepContext:
            return self.context(key, run_id=run.run_id)

        return settle_written_ahead(self.judge, self.mutations, key, run, context, publish)

    @staticmethod
    def _ownership_lost(key: StepKey, run: RunInfo) -> PipelineError:
        return PipelineError(
            ErrorCode.STEP_OWNERSHIP_LOST,
            f"{key}: run {run.run_id} lost its claim; nothing published",
        )

    def _publish(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        status: StepStatus,
        checkpoint: Checkpoint,
        summary: str,
        counts: Mapping[str, int],
        reads: Sequence[Path] | None = None,
        resolved_model: str | None = None,
    ) -> bool:
        """The fenced publish: status + checkpoint (+ seal when ``reads`` is given: verified
        clean) + its history line in one transaction, under the row's lock; a run that lost
        the row records the refusal instead."""
        line = audit_line(
            run, decision, action=AuditAction.FINISH, from_status=StepStatus.RUNNING,
            to_status=status, reason=summary,
        )  # fmt: skip
        kwargs: dict[str, Any] = {
            "summary": summary or None,
            "resolved_model": resolved_model,
            "audit": line,
            "refused": line.refused(
                AuditAction.OWNERSHIP_LOST, f"run {run.run_id} lost its claim; nothing published"
            ),
            **counts,
        }
        if status == StepStatus.FAILED:
            return self.ledger.transition(key, run.run_id, status, **kwargs)
        if self.checkpoints.is_unchanged(checkpoint):
            kept = self.checkpoints.load(key)  # same content; its provenance stays on disk
            seal = (
                self.checkpoints.seal(kept, reads, revision=self.step.verify_revision)
                if kept and reads is not None
                else None
            )
            return self.ledger.transition(key, run.run_id, status, seal=seal, **kwargs)
        staged = self.checkpoints.stage(checkpoint)
        try:
            seal = (
                self.checkpoints.seal(
                    checkpoint, reads, file=staged.temp, revision=self.step.verify_revision
                )
                if reads is not None
                else None
            )
            return self.ledger.transition(
                key,
                run.run_id,
                status,
                publish=staged.commit,
                pointer=staged.pointer,
                seal=seal,
                **kwargs,
            )
        finally:
            staged.discard()

    # ------------------------------------------------------------------ force
    def invalidate_downstream(self, key: StepKey, run: RunInfo) -> list[StepKey]:
        """Explicit force only: downstream rows → stale, their checkpoints archived + marked."""
        return invalidate_downstream(self.judge, self.writers, key, run)
