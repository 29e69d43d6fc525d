"""The run protocol every step execution follows, written once.

gate → applicability → judge (``steps.judge``: reads only) → SKIP / BLOCK / claim →
(force: cleanup and invalidate downstream) → finalize: execute, status, exit verify,
owner-aware status + fenced publish, recovery bookkeeping, mutator hook
(``steps.mutations``). Any failure between the claim and the publish records an
owner-aware ``failed`` and re-raises. Dagster-free: the asset factory adapts it.
"""

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pipeline_defs.project import ProjectConfig, models_called, scoped_fingerprints
from pipeline_defs.resume.clock import format_timestamp, parse_timestamp
from pipeline_defs.resume.completion import CompletionReport, Origin, report_from_exception
from pipeline_defs.resume.decision import (
    CODE_RECOVERY_EXHAUSTED,
    LaunchMode,
    ResumeAction,
    ResumeDecision,
    config_hash,
)
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.steps.context import ProviderMeter, StepContext
from pipeline_defs.steps.faults import crash_point
from pipeline_defs.steps.judge import AUTOMATIC_LAUNCH_PATH, StepJudge, recovery_way_out
from pipeline_defs.steps.lease import OWNERSHIP_LOST, Lease
from pipeline_defs.steps.mutations import (
    Intent,
    MutatorEdits,
    drop_written_ahead,
    intents_data,
    write_ahead,
)
from pipeline_defs.steps.redraw import Redraw, dependents_of, resolve_targets
from pipeline_defs.steps.spec import Step, StepResult
from resources.checkpoints.envelope import Checkpoint, mask_secrets
from resources.ledger.audit import Audit
from resources.providers import ImageModel, TextModel

SETTLED_UPSTREAM = frozenset({"completed", "partial", "not_applicable"})
UNSETTLED_ROW = frozenset({"running", "failed", "stale", "pending"})


@dataclass(frozen=True)
class RunInfo:
    """Who is running: the ledger owner token, the requested mode, the launch path."""

    run_id: str
    mode: LaunchMode = LaunchMode.RESUME
    launch_path: str = "api"
    redraw: Redraw | None = None  # the request (tags); resolved per step by ``run``
    redraw_items: frozenset[str] = frozenset()  # this step's targets, once resolved

    @property
    def automatic(self) -> bool:
        """Launched by the resume sensor: the only launches whose recoveries are counted
        . An operator's own launch is not an automatic recovery: counting it
         let three operator runs killed in a row exhaust the step against that operator."""
        return self.launch_path == AUTOMATIC_LAUNCH_PATH


@dataclass(frozen=True)
class StepOutcome:
    decision: ResumeDecision
    status: str
    checkpoint: Checkpoint | None
    provider_calls: int = 0
    mutated: tuple[str, ...] = ()
    report: CompletionReport | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Published:
    """A run's final word, now in the ledger (so a later failure is not recorded over it),
    and what is left to do after it."""

    status: str
    checkpoint: Checkpoint
    summary: str
    ctx: StepContext
    report: CompletionReport | None = None
    provider_calls: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    mutated: tuple[str, ...] = ()  # victims already brought to the published intents
    settle: tuple[Intent, ...] = ()  # a mutator's intents, applied after the publish


class StepRunner:
    """Runs one step for a partition: the only writer of its row, checkpoint and audit."""

    def __init__(
        self,
        judge: StepJudge,
        *,
        text_model: TextModel | None = None,
        image_model: ImageModel | None = None,
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
        self.ledger = judge.ledger
        self.checkpoints = judge.checkpoints
        self.log = judge.log
        self.clock = judge.clock
        self.text_model = text_model
        self.image_model = image_model
        self.mutations = MutatorEdits(
            judge, ledger=self.ledger, checkpoints=self.checkpoints, clock=self.clock
        )

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
        return dataclasses.replace(
            self.judge.context(key), run_id=run_id, meter=meter, redraw=redraw
        )

    def models(self, project: ProjectConfig) -> tuple[TextModel | None, ImageModel | None]:
        """The models this project's ``provider:`` section asks for, checked ready to call
        (config, key): a typed ``provider.*`` error here comes before any claim or call."""
        text = image = None
        if self.text_model is not None:
            text = self.text_model.for_provider(project.provider)
        if self.image_model is not None:
            image = self.image_model.for_provider(project.provider)
        # only the models this step calls need a key (story_source: none).
        called = models_called(self.step.resume_config_keys)
        for model, calls in zip((text, image), called, strict=True):
            if model is not None and calls:
                model.preflight()
        return text, image

    # ------------------------------------------------------------------ running
    def gate(self, key: StepKey) -> None:
        """Upstream checkpoints must be present and settled, and nobody re-running them."""
        rows = (
            self.ledger.get_many(episodes=[key.episode], step_ids=self.step.deps)
            if self.step.deps
            else {}
        )
        for dep in self.step.deps:
            dep_key = StepKey(key.project_id, key.episode_id, dep)
            row = rows.get(dep_key)
            checkpoint, broken = self.judge.load_checkpoint(dep_key)
            problem = None
            if broken is not None:
                raise broken
            if checkpoint is None:
                problem = "has no checkpoint"
            elif checkpoint.status not in SETTLED_UPSTREAM:
                problem = f"checkpoint status is {checkpoint.status}"
            elif row is not None and row["status"] in UNSETTLED_ROW:
                problem = f"ledger status is {row['status']}"
            elif self.graph_step(dep).modifies_checkpoints:
                problem = self._mutator_pending(dep_key, row)
            if problem:
                raise PipelineError(
                    "step.gate_blocked",
                    f"{key}: upstream {dep} {problem}; materialize it first",
                    details={"upstream": dep},
                )

    def graph_step(self, step_id: str) -> Step:
        return self.judge.graph.step(step_id)

    def _mutator_pending(self, key: StepKey, row: LedgerRow | None) -> str | None:
        """Why an upstream mutator (the review) must run before this step may read, or None.

        Its row can be ``completed`` while a victim changed under it (an accepted hand
        edit, a self-only re-run): the prompts it fixes are then unreviewed, and a step
        drawing from them now would spend on pictures the review would redo. The sensor
        waits on it (docs/DESIGN.md#review); a launch of this step alone waits too.
        """
        judged = self.judge.for_step(key.step_id).judge(key, mode=LaunchMode.RESUME, row=row)
        decision = judged.decision
        if decision.action in (ResumeAction.SKIP, ResumeAction.NOT_APPLICABLE):
            return None
        return (
            f"must run first ({decision.label}: {decision.reason}); "
            "its edits are not yet in what this step reads"
        )

    @staticmethod
    def audit_line(
        run: RunInfo,
        decision: ResumeDecision,
        *,
        action: str,
        from_status: str | None,
        to_status: str | None,
        reason: str | None = None,
    ) -> Audit:
        """A history line of this run's judgement (docs/DESIGN.md#audit)."""
        return Audit(
            action=action,
            from_status=from_status,
            to_status=to_status,
            origin=decision.origin.value if decision.origin else None,
            reason=reason or decision.reason,
            run_id=run.run_id,
            launch_path=run.launch_path,
        )

    def run(
        self, partition_key: str, run: RunInfo, inputs: Mapping[str, Checkpoint | None]
    ) -> StepOutcome:
        key = self.judge.key(partition_key)
        self.checkpoints.sync_inputs(key.project_id, key.episode_id)  # object storage
        self.gate(key)
        if run.redraw is not None:  # unknown ids fail here: before the claim, nothing changed
            run = self._resolve_redraw(key, run)
        row = self.ledger.get(key)
        judgement = self.judge.judge(key, mode=run.mode, row=row)
        decision = judgement.decision
        prior = row["status"] if row else None

        if decision.action is ResumeAction.NOT_APPLICABLE:
            return self._not_applicable(key, run, decision, prior)
        if decision.action is ResumeAction.SKIP:
            if not (decision.adopt and self._adopt(key, run, decision, judgement.checkpoint)):
                skipped = self.audit_line(
                    run, decision, action="skip", from_status=prior, to_status=prior
                )
                self.ledger.append_audit(key, skipped)
            return StepOutcome(decision, "skip", judgement.checkpoint)
        if decision.action is ResumeAction.BLOCK:
            blocked = self.audit_line(
                run, decision, action="block", from_status=prior, to_status=prior
            )
            self.ledger.append_audit(key, blocked)
            message = f"{key}: {decision.reason}"
            if decision.code == CODE_RECOVERY_EXHAUSTED and row is not None:
                # The commands that get past it, as ``decide`` prints them; first, so that a
                # one-line view that clips the (long) reason still shows them whole.
                way_out = recovery_way_out(key, row.status, row.run_id, row.started_at)
                message = f"{key}: next: {way_out}; {decision.reason}"
            raise PipelineError(
                decision.code or "step.resume_blocked",
                message,
                origin=decision.origin.value if decision.origin else None,
                details={"decision": decision.action.value},
            )
        # no key or a bad provider fails here, before the claim and any call,
        # and only for a step that will run (a SKIP or a BLOCK calls no model).
        self.models(self.judge.project(key))
        outcome = self._claim_and_finalize(key, run, decision, prior, row, inputs)
        if run.redraw_items:
            outcome = self._report_dependents(key, run, outcome)
        return outcome

    def _resolve_redraw(self, key: StepKey, run: RunInfo) -> RunInfo:
        """This step's redraw targets; a run asking for none of its items resumes as usual."""
        assert run.redraw is not None
        if run.mode is LaunchMode.FORCE:
            raise PipelineError(
                "redraw.invalid", f"{key}: a launch is a force or a redraw, not both"
            )

        def load(step_id: str) -> Checkpoint | None:
            return self.checkpoints.load(StepKey(key.project_id, key.episode_id, step_id))

        steps = self.judge.graph.declared
        targets = resolve_targets(self.step, key, run.redraw, load, steps)
        mode = LaunchMode.REDRAW if targets else LaunchMode.RESUME
        return dataclasses.replace(run, mode=mode, redraw_items=targets)

    def _report_dependents(self, key: StepKey, run: RunInfo, outcome: StepOutcome) -> StepOutcome:
        """Name the downstream items built from what was just redrawn (run metadata)."""

        def load(step_id: str) -> Checkpoint | None:
            found, _broken = self.judge.load_checkpoint(
                StepKey(key.project_id, key.episode_id, step_id)
            )
            return found

        steps = self.judge.graph.declared
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

    def _adopt(
        self, key: StepKey, run: RunInfo, decision: ResumeDecision, checkpoint: Checkpoint | None
    ) -> bool:
        """Row 4: the orphan checkpoint was just verified clean; record it, sealed."""
        seal = (
            self.checkpoints.seal(
                checkpoint,
                self.judge.verifier_reads(self.judge.context(key)),
                revision=self.step.verify_revision,
            )
            if checkpoint is not None
            else None
        )
        line = self.audit_line(
            run, decision, action="adopt", from_status=None, to_status="completed"
        )
        return self.ledger.adopt(key, run.run_id, summary=decision.reason, seal=seal, audit=line)

    def _not_applicable(
        self, key: StepKey, run: RunInfo, decision: ResumeDecision, prior: str | None
    ) -> StepOutcome:
        line = self.audit_line(
            run, decision, action="not_applicable", from_status=prior, to_status="not_applicable"
        )
        if not self.ledger.mark_not_applicable(key, run.run_id, decision.reason, audit=line):
            raise PipelineError("step.already_running", f"{key}: another run owns this step")
        checkpoint = self._envelope(
            key,
            StepResult(data={}, applicable_count=0),
            "not_applicable",
            run,
            self.judge.project(key),
        )
        self.checkpoints.save(
            checkpoint,
            fence=lambda staged: self.ledger.publish(
                key, run.run_id, staged.commit, pointer=staged.pointer
            ),
        )
        return StepOutcome(decision, "not_applicable", checkpoint)

    def _lease_hint(self, key: StepKey, row: Mapping[str, Any] | None) -> str:
        """What an operator can do about the running row a claim lost to (empty if none).

        Judged as the judge and ``audit-running`` judge a running row: by its lease (the
        heartbeat's age against ``lease_seconds``), by ``running_timeout_seconds`` only for
        a row without a heartbeat. A step that started hours ago and renewed its lease a
        moment ago is alive: no reset is offered for it. An explicit force never steals a
        lease, not even an expired one: say so, and how.
        """
        typed = LedgerRow.of(row)
        if typed is None or not typed.is_running:
            return ""
        owner, raw = typed.run_id, typed.started_at
        started = parse_timestamp(raw)
        reset = (
            f"storyboard reset-running --partition {key.partition_key} --step {key.step_id} "
            f"--expected-started-at {raw}"
        )
        if started is None:
            return f"; run {owner!r} holds it with an unreadable started_at {raw!r}"
        now = self.clock()
        lease = self.settings.lease_seconds
        beat = parse_timestamp(typed.heartbeat_at)
        if beat is not None:
            age = (now - beat).total_seconds()
            if age < lease:
                return (
                    f"; run {owner!r} is working on it: last heartbeat {max(age, 0):.0f}s ago "
                    f"(lease {lease:g}s, started {raw})"
                )
            return (
                f"; run {owner!r} holds an expired lease (last heartbeat {age:.0f}s ago, past "
                f"lease_seconds={lease:g}): a resume launch recovers it, or if that run is "
                f"dead: {reset}"
            )
        elapsed = (now - started).total_seconds()
        timeout = self.settings.running_timeout_seconds
        if elapsed >= timeout:
            return (
                f"; run {owner!r} holds an expired lease (no heartbeat, started {raw}, "
                f"{elapsed:.0f}s ago, past running_timeout_seconds={timeout}): a resume launch "
                f"recovers it, or if that run is dead: {reset}"
            )
        return f"; run {owner!r} has held it for {elapsed:.0f}s (started {raw}, no heartbeat)"

    def _claim_and_finalize(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        prior: str | None,
        row: Mapping[str, Any] | None,
        inputs: Mapping[str, Checkpoint | None],
    ) -> StepOutcome:
        stale = decision.action is ResumeAction.STALE_RUNNING_RECOVERY
        # Row 12 counts automatic recoveries: the sensor's. An operator's launch of the same
        # decision takes the row over uncounted, leaving the count and last reason as the
        # sensor's recoveries left them (visible in ``status``).
        counted = decision.auto_recovery and run.automatic
        line = self.audit_line(
            run, decision, action=decision.action.value, from_status=prior, to_status="running"
        )
        won = self.ledger.claim(
            key,
            run.run_id,
            allow_stale_steal=stale,
            expected_started_at=decision.expected_started_at,
            expected_run_id=decision.expected_run_id,
            expected_heartbeat_at=decision.expected_heartbeat_at,
            auto_recovery=counted,
            reason=decision.reason,
            seen=row,
            audit=line,
            refused=line.refused("claim_rejected", decision.reason),
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
            raise PipelineError(
                "step.already_running",
                f"{key}: another run owns this step or changed it since it was judged "
                f"(claim for {decision.action.value} refused){self._lease_hint(key, row)}",
            )
        attempts = max(1, int((row or {}).get("recovery_count") or 0) + (1 if counted else 0))
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
            with self._failures_recorded(key, run, decision, attempts):
                crash_point("claimed", key.step_id)
                force = decision.action is ResumeAction.FORCE_EXPLICIT
                if force:
                    cleanup = self.step.cleanup_artifacts(self.context(key, run_id=run.run_id))
                    self.log.info("%s: force cleanup: %s", key, cleanup.note)
                    self.invalidate_downstream(key, run, decision)
                # a mutator whose published edits were cut short settles them, no provider call
                published = (
                    self._settle_published(key, run, decision)
                    if self.step.modifies_checkpoints and not force
                    else None
                )
                if published is None:
                    published = self._execute_and_publish(key, run, decision, inputs, lease)
            return self._after_publish(key, run, decision, attempts, published)

    @contextlib.contextmanager
    def _failures_recorded(
        self, key: StepKey, run: RunInfo, decision: ResumeDecision, attempts: int
    ) -> Iterator[None]:
        """Record a failure of the enclosed work as this run's final word (owner-aware):
        only where the ledger does not hold one yet. A lost lease records nothing (the row
        is no longer ours)."""
        try:
            yield
        except BaseException as exc:
            if not (isinstance(exc, PipelineError) and exc.code == OWNERSHIP_LOST):
                self._record_failure(key, run, decision, exc, attempts)
            raise

    def _record_failure(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        exc: BaseException,
        attempts: int,
    ) -> None:
        message = str(exc) or type(exc).__name__
        line = self.audit_line(
            run, decision, action="failed", from_status="running", to_status="failed",
            reason=message[:500],
        )  # fmt: skip
        if self.ledger.transition(key, run.run_id, "failed", error=message[:2000], audit=line):
            self._schedule_retry(key, run, attempts)

    def _schedule_retry(self, key: StepKey, run: RunInfo, attempts: int) -> None:
        when = self.clock() + timedelta(seconds=attempts * self.settings.retry_backoff_seconds)
        self.ledger.set_retry_not_before(key, run.run_id, format_timestamp(when))

    def _execute_and_publish(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        inputs: Mapping[str, Checkpoint | None],
        lease: Lease,
    ) -> Published:
        # (1) execute with metered providers: the models of the project, resolved now
        text_model, image_model = self.models(self.judge.project(key))
        meter = ProviderMeter(
            self.ledger, key, run.run_id, text_model, image_model, guard=lease.check
        )
        ctx = self.context(key, run_id=run.run_id, meter=meter, redraw=run.redraw_items)
        started = self.clock()
        result = self.step.execute(ctx, {dep: cp for dep, cp in inputs.items() if cp is not None})
        crash_point("executed", key.step_id)
        # (1b) a mutator's edits: prepared and verified now, written ahead before it publishes
        edits = []
        if self.step.modifies_checkpoints:
            edits = self.mutations.prepare(key, run.run_id, result.mutations, inputs)
            result = dataclasses.replace(
                result, data=intents_data(result.data, [e.intent for e in edits])
            )
        # (2) final status from the counts
        status = result.status
        checkpoint = self._envelope(key, result, status, run, ctx.project, started)
        self.step.validate_data(checkpoint.data, source=str(self.checkpoints.path_for(key)))
        # (3) exit verify of what we are about to publish
        report: CompletionReport | None = None
        if status == "completed":
            try:
                report = self.judge.verify(ctx, checkpoint)
            except PipelineError as exc:  # a typed verdict (contract drift), not a crash
                report = report_from_exception(exc)
            except Exception as exc:
                raise PipelineError(
                    "step.verify_crashed",
                    f"{key}: exit verification crashed: {type(exc).__name__}: {exc}",
                    origin=Origin.VERIFY_CRASHED.value,
                ) from exc
            if not report.is_complete:
                status = "partial"
                checkpoint = checkpoint.with_changes(status=status)
        # (4)+(5) owner-aware status and fenced publish, one transaction
        counts = {
            "applicable_count": result.applicable_count,
            "completed_count": result.completed,
            "failed_count": result.failed_count,
        }
        # A clean completed result is sealed: its files' identities go into the row, so a
        # read-only judge can trust this verification while they stay unchanged.
        reads = (
            self.judge.verifier_reads(ctx)
            if status == "completed" and report is not None and report.is_complete
            else None
        )
        lease.check()  # a lost lease publishes nothing (the owner-aware update would refuse)
        if edits and status != "failed":
            write_ahead(self.checkpoints, key, edits, checkpoint)
        published = self._publish(
            key,
            run,
            decision,
            status,
            checkpoint,
            result.summary,
            counts,
            reads,
            meter.resolved_model,
        )
        crash_point("published", key.step_id)
        if not published:
            raise PipelineError(
                "step.ownership_lost", f"{key}: run {run.run_id} lost its claim; nothing published"
            )
        return Published(
            status,
            checkpoint,
            result.summary,
            ctx,
            report=report,
            provider_calls=meter.calls,
            metadata=dict(result.metadata),
            settle=tuple(e.intent for e in edits),
        )

    def _settle_published(
        self, key: StepKey, run: RunInfo, decision: ResumeDecision
    ) -> Published | None:
        """A mutator whose edits are written ahead but not all applied: apply them instead of
        reviewing again (no provider call). Either its checkpoint is published (the process
        died while settling), or the process died before publishing it: the
        written-ahead copy is published now and ``_after_publish`` settles its edits, as the
        killed run would have. None when that is not possible (no intents, or a victim
        changed since): review again."""
        found = self.mutations.settlement(key, lambda: self.context(key, run_id=run.run_id))
        if found is None:
            return None
        reads = self.judge.verifier_reads(found.ctx)
        if found.written_ahead:
            summary = (
                f"published the review written ahead by run "
                f"{found.checkpoint.produced_by.get('run_id')!r} (killed before it published); "
                "its edits are applied next, no provider call"
            )
            if not self._publish(
                key, run, decision, "completed", found.checkpoint, summary, {}, reads
            ):
                raise PipelineError(
                    "step.ownership_lost",
                    f"{key}: run {run.run_id} lost its claim; nothing published",
                )
            crash_point("published", key.step_id)
            return Published(
                "completed",
                found.checkpoint,
                summary,
                found.ctx,
                report=found.report,
                settle=found.intents,
            )
        mutated = self.mutations.settle(
            key,
            found.intents,
            found.checkpoint,
            found.ctx,
            run_id=run.run_id,
            launch_path=run.launch_path,
            reseal=False,
        )
        summary = f"settled the written-ahead edits of {', '.join(mutated) or 'no victim'}"
        if not self._publish(key, run, decision, "completed", found.checkpoint, summary, {}, reads):
            raise PipelineError(
                "step.ownership_lost", f"{key}: run {run.run_id} lost its claim; nothing published"
            )
        return Published(
            "completed", found.checkpoint, summary, found.ctx, report=found.report, mutated=mutated
        )

    def _after_publish(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        attempts: int,
        published: Published,
    ) -> StepOutcome:
        """Recovery bookkeeping and a mutator's settle, once the row holds the result (and
        its history line, written with it by ``_publish``)."""
        status = published.status
        # (6) recovery bookkeeping
        if status == "completed":
            self.ledger.reset_recovery(key, run.run_id)
        elif status == "failed":
            self._schedule_retry(key, run, attempts)
            raise PipelineError(
                "step.execute_failed", f"{key}: every item failed ({published.summary})"
            )
        # (7) a mutator settles its victims: a failed edit fails it (recorded)
        mutated = published.mutated
        if published.settle:
            with self._failures_recorded(key, run, decision, attempts):
                mutated = self.mutations.settle(
                    key,
                    published.settle,
                    published.checkpoint,
                    published.ctx,
                    run_id=run.run_id,
                    launch_path=run.launch_path,
                    reseal=status == "completed",
                )
        if self.step.modifies_checkpoints:  # the row holds the result: the copy is spent
            drop_written_ahead(self.checkpoints, key)
        crash_point("finished", key.step_id)
        return StepOutcome(
            decision,
            status,
            published.checkpoint,
            provider_calls=published.provider_calls,
            mutated=mutated,
            report=published.report,
            metadata=published.metadata,
        )

    def _publish(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        status: str,
        checkpoint: Checkpoint,
        summary: str,
        counts: Mapping[str, int],
        reads: Sequence[Path] | None = None,
        resolved_model: str | None = None,
    ) -> bool:
        """Status + checkpoint (+ seal when ``reads`` is given: verified clean) + its history
        line in one transaction; a run that lost the row records the refusal instead."""
        line = self.audit_line(
            run, decision, action="finish", from_status="running", to_status=status,
            reason=summary,
        )  # fmt: skip
        kwargs: dict[str, Any] = {
            "summary": summary or None,
            "resolved_model": resolved_model,
            "audit": line,
            "refused": line.refused(
                "ownership_lost", f"run {run.run_id} lost its claim; nothing published"
            ),
            **counts,
        }
        if status == "failed":
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

    def _envelope(
        self,
        key: StepKey,
        result: StepResult,
        status: str,
        run: RunInfo,
        project: ProjectConfig,
        started: datetime | None = None,
    ) -> Checkpoint:
        config = project.as_dict()
        fingerprints = scoped_fingerprints(config, self.step.resume_config_keys)
        return Checkpoint(
            step_id=key.step_id,
            project_id=key.project_id,
            episode_id=key.episode_id,
            status=status,
            schema_version=self.step.schema_version,
            config_hash=config_hash(fingerprints),
            resume_config_keys=tuple(self.step.resume_config_keys),
            config_fingerprints=fingerprints,
            project_config_snapshot=mask_secrets(config),
            data=dict(result.data),
            artifacts=tuple(result.artifacts),
            produced_by={
                "run_id": run.run_id,
                "started_at": format_timestamp(started or self.clock()),
                "launch_path": run.launch_path,
            },
            created_at=format_timestamp(self.clock()),
        )

    # ------------------------------------------------------------------ force
    def invalidate_downstream(
        self, key: StepKey, run: RunInfo, decision: ResumeDecision
    ) -> list[StepKey]:
        """Explicit force only: downstream rows → stale, their checkpoints archived + marked."""
        targets = self.judge.downstream_keys(key)
        if not targets:
            return []
        for target in targets:  # again under our claim, before the first row changes
            self.checkpoints.refuse_links_in_tree(target)
        reason = f"invalidated by explicit force of {key.step_id} (run {run.run_id})"
        rows = self.ledger.get_many(episodes=[key.episode], step_ids=[t.step_id for t in targets])
        staled = set(self.ledger.invalidate(targets, reason))
        cleared: list[StepKey] = []
        for target in targets:
            row = rows.get(target)
            if row is not None and row["status"] == "running" and target not in staled:
                continue  # its owner will publish; never clear under a live run
            self.checkpoints.force_clear(target)
            cleared.append(target)
            self.ledger.append_transition(
                target,
                action="invalidate",
                from_status=row["status"] if row else None,
                to_status="stale" if target in staled else (row["status"] if row else None),
                reason=reason,
                run_id=run.run_id,
                launch_path=run.launch_path,
            )
        return cleared
