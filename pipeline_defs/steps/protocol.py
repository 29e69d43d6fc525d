"""The run protocol every step execution follows, written once.

gate → applicability → judge (never writes) → SKIP / BLOCK / claim → (force: cleanup and
invalidate downstream) → finalize: execute, status, exit verify, owner-aware status +
fenced publish, recovery bookkeeping, mutator hook. Any failure after the claim records an
owner-aware ``failed`` and re-raises. Dagster-free: the asset factory adapts it.
"""

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pipeline_defs.project import ProjectConfig, load_project_config, scoped_fingerprints
from pipeline_defs.resume.clock import format_timestamp, parse_timestamp
from pipeline_defs.resume.completion import (
    CompletionReport,
    Origin,
    Severity,
    merge_reports,
    report_from_exception,
)
from pipeline_defs.resume.decision import (
    CLAIMING_ACTIONS,
    CODE_RESUME_BLOCKED,
    CheckpointSummary,
    LaunchMode,
    ResumeAction,
    ResumeDecision,
    ScopedConfig,
    config_hash,
    decide,
)
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.steps.context import ProviderMeter, StepContext
from pipeline_defs.steps.faults import crash_point
from pipeline_defs.steps.lease import OWNERSHIP_LOST, Lease
from pipeline_defs.steps.mutations import (
    Intent,
    PreparedEdit,
    intent_report,
    intents_data,
    intents_of,
    settle,
    write_ahead,
)
from pipeline_defs.steps.redraw import Redraw, dependents_of, downstream_of, resolve_targets
from pipeline_defs.steps.spec import Mutation, Step, StepResult
from resources.checkpoints.envelope import Checkpoint, mask_secrets
from resources.checkpoints.seal import Seal
from resources.checkpoints.store import SYMLINK_CODE, CheckpointStore
from resources.ledger.store import LedgerStore
from resources.providers import ImageModel, TextModel

SETTLED_UPSTREAM = frozenset({"completed", "partial", "not_applicable"})
UNSETTLED_ROW = frozenset({"running", "failed", "stale", "pending"})


_SEALED_CLEAN = CompletionReport.clean(sealed=True)


def _sealed_clean() -> CompletionReport:
    """The verdict a holding seal stands for (one shared, immutable report)."""
    return _SEALED_CLEAN


@dataclass(frozen=True)
class RunInfo:
    """Who is running: the ledger owner token, the requested mode, the launch path."""

    run_id: str
    mode: LaunchMode = LaunchMode.RESUME
    launch_path: str = "api"
    redraw: Redraw | None = None  # the request (tags); resolved per step by ``run``
    redraw_items: frozenset[str] = frozenset()  # this step's targets, once resolved


@dataclass(frozen=True)
class Judgement:
    """A decision plus what it was made from (for SKIP outputs and reporting)."""

    key: StepKey
    decision: ResumeDecision
    checkpoint: Checkpoint | None
    row: Mapping[str, Any] | None


@dataclass(frozen=True)
class StepOutcome:
    decision: ResumeDecision
    status: str
    checkpoint: Checkpoint | None
    provider_calls: int = 0
    mutated: tuple[str, ...] = ()
    report: CompletionReport | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


def utc_now() -> datetime:
    return datetime.now(UTC)


class StepRuntime:
    """One step bound to its stores and providers. Judges and runs it for a partition."""

    def __init__(
        self,
        step: Step,
        *,
        steps: Mapping[str, Step],
        settings: ResumeSettings,
        ledger: LedgerStore,
        checkpoints: CheckpointStore,
        text_model: TextModel | None = None,
        image_model: ImageModel | None = None,
        log: logging.Logger | None = None,
        clock: Callable[[], datetime] = utc_now,
        owner_ended: Callable[[str], str | None] | None = None,
    ) -> None:
        self.step = step
        self.steps = steps
        self.settings = settings
        self.ledger = ledger
        self.checkpoints = checkpoints
        self.text_model = text_model
        self.image_model = image_model
        self.log = log or logging.getLogger(f"storyboard.{step.step_id}")
        self.clock = clock
        # Owner token -> the terminal state of its Dagster run, if it has ended (evidence of
        # a dead lease that needs no waiting; None where no Dagster instance is at hand).
        self.owner_ended = owner_ended

    # ------------------------------------------------------------------ helpers
    def key(self, partition_key: str) -> StepKey:
        from pipeline_defs.resume.partition import Episode

        return Episode.parse(partition_key).step(self.step.step_id)

    def project(self, key: StepKey) -> ProjectConfig:
        return load_project_config(self.checkpoints.home, key.project_id)

    def context(
        self,
        key: StepKey,
        *,
        run_id: str | None = None,
        meter: ProviderMeter | None = None,
        redraw: frozenset[str] = frozenset(),
    ) -> StepContext:
        return StepContext(
            key=key,
            project=self.project(key),
            checkpoints=self.checkpoints,
            ledger=self.ledger,
            run_id=run_id,
            meter=meter,
            log=self.log,
            redraw=redraw,
        )

    def downstream(self) -> tuple[str, ...]:
        """Every step that transitively depends on this one, in declaration order."""
        return downstream_of(self.steps.values(), self.step.step_id)

    def models(self, project: ProjectConfig) -> tuple[TextModel | None, ImageModel | None]:
        """The models this project's ``provider:`` section asks for, checked ready to call
        (config, key): a typed ``provider.*`` error here comes before any claim or call."""
        text = image = None
        if self.text_model is not None:
            text = self.text_model.for_provider(project.provider)
        if self.image_model is not None:
            image = self.image_model.for_provider(project.provider)
        for model in (text, image):
            if model is not None:
                model.preflight()
        return text, image

    def scoped_config(self, project: ProjectConfig) -> ScopedConfig:
        return ScopedConfig(scoped_fingerprints(project.as_dict(), self.step.resume_config_keys))

    # ------------------------------------------------------------------ judging
    def verify(self, ctx: StepContext, checkpoint: Checkpoint) -> CompletionReport:
        """Envelope artifacts + sentinels + the step's own verifier, merged by priority."""
        reports: list[CompletionReport] = []
        missing, changed = self.checkpoints.artifact_problems(checkpoint)
        if missing:
            severity = (
                Severity.MISSING if len(missing) >= len(checkpoint.artifacts) else Severity.PARTIAL
            )
            reports.append(
                CompletionReport.incomplete(Origin.ARTIFACT_MISSING, tuple(missing), severity)
            )
        if changed:  # present but not what was published: the step declares what that means
            reports.append(
                CompletionReport.incomplete(
                    self.step.changed_artifact_origin, tuple(changed), Severity.PARTIAL
                )
            )
        try:
            self.step.validate_data(checkpoint.data, source=str(self.checkpoints.path_for(ctx.key)))
        except PipelineError as exc:
            origin = Origin(exc.origin) if exc.origin in set(Origin) else Origin.CONTRACT_DRIFT
            reports.append(CompletionReport.incomplete(origin, (exc.message,)))
        reports.append(self.step.verify_completion(ctx, checkpoint))
        return merge_reports(*reports)

    def verifier_reads(self, ctx: StepContext) -> tuple[Path, ...]:
        """What a verdict of this step may depend on besides its checkpoint and artifacts:
        the episode's input directory and files, and ``Step.verify_reads``.

        Not the project config: the judge compares the step's scoped config itself, and an
        edit of an unrelated key must not void every seal of the project.
        """
        inputs = ctx.episode_dir
        try:
            files = sorted(p for p in inputs.iterdir() if p.is_file())
        except OSError:
            files = []
        victims = [
            self.checkpoints.path_for(StepKey(ctx.key.project_id, ctx.key.episode_id, v))
            for v in self.step.modifies_checkpoints
        ]
        return tuple(dict.fromkeys([inputs, *files, *self.step.verify_reads(ctx), *victims]))

    def load_checkpoint(self, key: StepKey) -> tuple[Checkpoint | None, PipelineError | None]:
        try:
            return self.checkpoints.load(key), None
        except PipelineError as exc:
            return None, exc

    def judge(
        self,
        key: StepKey,
        *,
        mode: LaunchMode,
        row: Mapping[str, Any] | None,
        now: datetime | None = None,
        loaded: tuple[Checkpoint | None, PipelineError | None] | None = None,
        sealed: Seal | None = None,
    ) -> Judgement:
        """Gather the inputs of ``decide`` and call it. Reads only; never writes.

        ``sealed``: a seal of this key's checkpoint that still holds (read-only judges):
        the publishing run's clean verification stands in for reading and verifying again.
        """
        ctx = self.context(key)
        config = self.scoped_config(ctx.project)
        if sealed is None and loaded is None:
            loaded = self.load_checkpoint(key)
        checkpoint, summary, verify = self._evidence(ctx, config, loaded, sealed)
        ended = (
            self.owner_ended(str(row.get("run_id")))
            if self.owner_ended is not None and row and row.get("status") == "running"
            else None
        )
        decision = decide(
            mode=mode,
            applicable=self.step.is_applicable(ctx),
            row=row,
            owner_ended=ended,
            checkpoint=summary,
            verify=verify,
            step=self.step,
            config=config,
            settings=self.settings,
            now=now or self.clock(),
        )
        broken = loaded[1] if loaded is not None else None
        if broken is None and decision.action in CLAIMING_ACTIONS:
            try:  # a re-run would write there: a link anywhere in its way blocks it first
                self.refuse_links_to_write(key, decision)
            except PipelineError as exc:
                if exc.code != SYMLINK_CODE:
                    raise
                broken = exc
        if (
            broken is not None
            and broken.code == SYMLINK_CODE
            and decision.action is not ResumeAction.BLOCK
        ):
            # The table reaches the verifier (which reports the link) only for some rows; a
            # failed or stale row would be re-run, i.e. written through or over the link.
            # A link where our file should be blocks whatever the row says (SPEC §11), in
            # the sensor too (a block reported, not a launch that would only fail).
            decision = ResumeDecision(
                ResumeAction.BLOCK,
                broken.message,
                origin=Origin.CONTRACT_DRIFT,
                code=CODE_RESUME_BLOCKED,
            )
        return Judgement(key, decision, checkpoint, row)

    def _evidence(
        self,
        ctx: StepContext,
        config: ScopedConfig,
        loaded: tuple[Checkpoint | None, PipelineError | None] | None,
        sealed: Seal | None,
    ) -> tuple[Checkpoint | None, CheckpointSummary, Callable[[], CompletionReport]]:
        """The checkpoint, its summary and a lazy verifier: what ``decide`` judges from."""
        if sealed is not None:
            return None, sealed.summary, _sealed_clean
        checkpoint, broken = loaded if loaded is not None else self.load_checkpoint(ctx.key)
        if broken is not None:
            # A corrupt checkpoint is present but unusable: let the verifier's slot report
            # it with the error's origin, so the table classifies it (never "absent").
            summary = CheckpointSummary(
                present=True,
                schema_version=self.step.schema_version,
                status="completed",
                config_hash=config.hash,
                config_fingerprints=dict(config.fingerprints),
            )
            origin = (
                Origin(broken.origin) if broken.origin in set(Origin) else Origin.CONTRACT_DRIFT
            )
            return None, summary, lambda: CompletionReport.incomplete(origin, (broken.message,))
        if checkpoint is None:

            def absent() -> CompletionReport:  # the table never verifies an absent checkpoint
                raise AssertionError(f"{ctx.key}: asked to verify an absent checkpoint")

            return None, CheckpointSummary.absent(), absent
        found = checkpoint
        if self.step.modifies_checkpoints:  # and whether its victims hold its edits
            return (
                found,
                found.summary(),
                lambda: merge_reports(
                    self.verify(ctx, found), intent_report(self.checkpoints, ctx.key, found)
                ),
            )
        return found, found.summary(), lambda: self.verify(ctx, found)

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
            checkpoint, broken = self.load_checkpoint(dep_key)
            problem = None
            if broken is not None:
                raise broken
            if checkpoint is None:
                problem = "has no checkpoint"
            elif checkpoint.status not in SETTLED_UPSTREAM:
                problem = f"checkpoint status is {checkpoint.status}"
            elif row is not None and row["status"] in UNSETTLED_ROW:
                problem = f"ledger status is {row['status']}"
            if problem:
                raise PipelineError(
                    "step.gate_blocked",
                    f"{key}: upstream {dep} {problem}; materialize it first",
                    details={"upstream": dep},
                )

    def audit(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        *,
        action: str,
        from_status: str | None,
        to_status: str | None,
        reason: str | None = None,
    ) -> None:
        self.ledger.append_transition(
            key,
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
        key = self.key(partition_key)
        self.models(self.project(key))  # no key or a bad provider: fail before anything
        self.gate(key)
        if run.redraw is not None:  # unknown ids fail here: before the claim, nothing changed
            run = self._resolve_redraw(key, run)
        row = self.ledger.get(key)
        judgement = self.judge(key, mode=run.mode, row=row)
        decision = judgement.decision
        prior = row["status"] if row else None

        if decision.action is ResumeAction.NOT_APPLICABLE:
            return self._not_applicable(key, run, decision, prior)
        if decision.action is ResumeAction.SKIP:
            if decision.adopt and self._adopt(key, run, decision, judgement.checkpoint):
                self.audit(
                    key, run, decision, action="adopt", from_status=None, to_status="completed"
                )
            else:
                self.audit(key, run, decision, action="skip", from_status=prior, to_status=prior)
            return StepOutcome(decision, "skip", judgement.checkpoint)
        if decision.action is ResumeAction.BLOCK:
            self.audit(key, run, decision, action="block", from_status=prior, to_status=prior)
            raise PipelineError(
                decision.code or "step.resume_blocked",
                f"{key}: {decision.reason}",
                origin=decision.origin.value if decision.origin else None,
                details={"decision": decision.action.value},
            )
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

        targets = resolve_targets(self.step, key, run.redraw, load, self.steps.values())
        mode = LaunchMode.REDRAW if targets else LaunchMode.RESUME
        return dataclasses.replace(run, mode=mode, redraw_items=targets)

    def _report_dependents(self, key: StepKey, run: RunInfo, outcome: StepOutcome) -> StepOutcome:
        """Name the downstream items built from what was just redrawn (run metadata)."""

        def load(step_id: str) -> Checkpoint | None:
            found, _broken = self.load_checkpoint(StepKey(key.project_id, key.episode_id, step_id))
            return found

        found = dependents_of(self.steps.values(), load, key.step_id, sorted(run.redraw_items))
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
                self.verifier_reads(self.context(key)),
                revision=self.step.verify_revision,
            )
            if checkpoint is not None
            else None
        )
        return self.ledger.adopt(key, run.run_id, summary=decision.reason, seal=seal)

    def _not_applicable(
        self, key: StepKey, run: RunInfo, decision: ResumeDecision, prior: str | None
    ) -> StepOutcome:
        if not self.ledger.mark_not_applicable(key, run.run_id, decision.reason):
            raise PipelineError("step.already_running", f"{key}: another run owns this step")
        checkpoint = self._envelope(
            key, StepResult(data={}, applicable_count=0), "not_applicable", run, self.project(key)
        )
        self.checkpoints.save(
            checkpoint, fence=lambda commit: self.ledger.publish(key, run.run_id, commit)
        )
        self.audit(
            key,
            run,
            decision,
            action="not_applicable",
            from_status=prior,
            to_status="not_applicable",
        )
        return StepOutcome(decision, "not_applicable", checkpoint)

    def _lease_hint(self, key: StepKey, row: Mapping[str, Any] | None) -> str:
        """What an operator can do about the running row a claim lost to (empty if none).

        An explicit force never steals a lease, not even a stale one: say so, and how.
        """
        if row is None or str(row.get("status") or "").lower() != "running":
            return ""
        owner, raw = row.get("run_id"), row.get("started_at")
        started = parse_timestamp(raw)
        reset = (
            f"storyboard reset-running --partition {key.partition_key} --step {key.step_id} "
            f"--expected-started-at {raw}"
        )
        if started is None:
            return f"; run {owner!r} holds it with an unreadable started_at {raw!r}"
        elapsed = (self.clock() - started).total_seconds()
        if elapsed >= self.settings.running_timeout_seconds:
            return (
                f"; run {owner!r} holds a STALE lease (started {raw}, {elapsed:.0f}s ago, "
                f"past running_timeout_seconds={self.settings.running_timeout_seconds}): a "
                f"resume launch recovers it, or if that run is dead: {reset}"
            )
        return f"; run {owner!r} has held it for {elapsed:.0f}s (started {raw})"

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
        won = self.ledger.claim(
            key,
            run.run_id,
            allow_stale_steal=stale,
            expected_started_at=decision.expected_started_at,
            expected_run_id=decision.expected_run_id,
            expected_heartbeat_at=decision.expected_heartbeat_at,
            auto_recovery=decision.auto_recovery,
            reason=decision.reason,
            seen=row,
        )
        if not won:
            self.audit(
                key, run, decision, action="claim_rejected", from_status=prior, to_status=prior
            )
            raise PipelineError(
                "step.already_running",
                f"{key}: another run owns this step or changed it since it was judged "
                f"(claim for {decision.action.value} refused){self._lease_hint(key, row)}",
            )
        attempts = max(
            1, int((row or {}).get("recovery_count") or 0) + (1 if decision.auto_recovery else 0)
        )
        # "recorded" is True while the ledger already holds this run's final word.
        state = {"recorded": False}
        lease = Lease(
            self.ledger,
            key,
            run.run_id,
            interval_seconds=self.settings.heartbeat_seconds,
            log=self.log,
        )
        with lease:
            try:  # from here on the row is ours: any failure must be recorded, never left running
                self.audit(
                    key,
                    run,
                    decision,
                    action=decision.action.value,
                    from_status=prior,
                    to_status="running",
                )
                crash_point("claimed", key.step_id)
                if decision.action is ResumeAction.FORCE_EXPLICIT:
                    cleanup = self.step.cleanup_artifacts(self.context(key, run_id=run.run_id))
                    self.log.info("%s: force cleanup: %s", key, cleanup.note)
                    self.invalidate_downstream(key, run, decision)
                return self._finalize(key, run, decision, inputs, attempts, state, lease)
            except BaseException as exc:
                lost = isinstance(exc, PipelineError) and exc.code == OWNERSHIP_LOST
                if not state["recorded"] and not lost:
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
        if self.ledger.transition(key, run.run_id, "failed", error=message[:2000]):
            self._schedule_retry(key, run, attempts)
            self.audit(
                key,
                run,
                decision,
                action="failed",
                from_status="running",
                to_status="failed",
                reason=message[:500],
            )

    def _schedule_retry(self, key: StepKey, run: RunInfo, attempts: int) -> None:
        when = self.clock() + timedelta(seconds=attempts * self.settings.retry_backoff_seconds)
        self.ledger.set_retry_not_before(key, run.run_id, format_timestamp(when))

    def _finalize(
        self,
        key: StepKey,
        run: RunInfo,
        decision: ResumeDecision,
        inputs: Mapping[str, Checkpoint | None],
        attempts: int,
        state: dict[str, bool],
        lease: Lease,
    ) -> StepOutcome:
        # (0) a mutator whose published edits were cut short settles them, no provider call
        if self.step.modifies_checkpoints and decision.action is not ResumeAction.FORCE_EXPLICIT:
            resumed = self._settle_published(key, run, decision, state)
            if resumed is not None:
                return resumed
        # (1) execute with metered providers: the models of the project, resolved now
        text_model, image_model = self.models(self.project(key))
        meter = ProviderMeter(
            self.ledger, key, run.run_id, text_model, image_model, guard=lease.check
        )
        ctx = self.context(key, run_id=run.run_id, meter=meter, redraw=run.redraw_items)
        started = self.clock()
        result = self.step.execute(ctx, {dep: cp for dep, cp in inputs.items() if cp is not None})
        crash_point("executed", key.step_id)
        # (1b) a mutator's edits: prepared and verified now, written ahead before it publishes
        edits: list[PreparedEdit] = []
        if self.step.modifies_checkpoints:
            edits = self._prepare_edits(key, run, result.mutations, inputs)
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
                report = self.verify(ctx, checkpoint)
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
            self.verifier_reads(ctx)
            if status == "completed" and report is not None and report.is_complete
            else None
        )
        lease.check()  # a lost lease publishes nothing (the owner-aware update would refuse)
        if edits and status != "failed":
            write_ahead(self.checkpoints, key, edits)
        published = self._publish(
            key, run, status, checkpoint, result.summary, counts, reads, meter.resolved_model
        )
        crash_point("published", key.step_id)
        if not published:
            raise PipelineError(
                "step.ownership_lost", f"{key}: run {run.run_id} lost its claim; nothing published"
            )
        state["recorded"] = True
        self.audit(
            key,
            run,
            decision,
            action="finish",
            from_status="running",
            to_status=status,
            reason=result.summary or decision.reason,
        )
        # (6) recovery bookkeeping
        if status == "completed":
            self.ledger.reset_recovery(key, run.run_id)
        elif status == "failed":
            self._schedule_retry(key, run, attempts)
            raise PipelineError(
                "step.execute_failed", f"{key}: every item failed ({result.summary})"
            )
        # (7) a mutator settles its victims: a failed edit fails it (recorded by the caller)
        mutated: tuple[str, ...] = ()
        if edits:
            state["recorded"] = False
            intents = [e.intent for e in edits]
            mutated = self._settle(key, run, intents, checkpoint, ctx, reseal=status == "completed")
            state["recorded"] = True
        crash_point("finished", key.step_id)
        return StepOutcome(
            decision,
            status,
            checkpoint,
            provider_calls=meter.calls,
            mutated=mutated,
            report=report,
            metadata=dict(result.metadata),
        )

    def _publish(
        self,
        key: StepKey,
        run: RunInfo,
        status: str,
        checkpoint: Checkpoint,
        summary: str,
        counts: Mapping[str, int],
        reads: Sequence[Path] | None = None,
        resolved_model: str | None = None,
    ) -> bool:
        """Status + checkpoint (+ seal when ``reads`` is given: verified clean) in one step."""
        kwargs: dict[str, Any] = {
            "summary": summary or None,
            "resolved_model": resolved_model,
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
                key, run.run_id, status, publish=staged.commit, seal=seal, **kwargs
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

    # ------------------------------------------------------------------ force and mutations
    def downstream_keys(self, key: StepKey) -> list[StepKey]:
        return [StepKey(key.project_id, key.episode_id, s) for s in self.downstream()]

    def refuse_links_to_write(self, key: StepKey, decision: ResumeDecision) -> None:
        """``checkpoint.symlink`` if a step directory this claiming run may write in holds a
        link anywhere (SPEC §11): its own (pending edits, archive, artifacts) and, for an
        explicit force, every downstream one it will invalidate and clear.

        The judge checks this for every claiming decision (a block before the claim, any
        cleanup or provider call); the writers check again when they write. Checking all
        of them first is what keeps a refusal from leaving half a force behind (rows
        staled, a provider call paid).
        """
        targets = [key]
        if decision.action is ResumeAction.FORCE_EXPLICIT:
            targets += self.downstream_keys(key)
        for target in targets:
            self.checkpoints.refuse_links_in_tree(target)

    def invalidate_downstream(
        self, key: StepKey, run: RunInfo, decision: ResumeDecision
    ) -> list[StepKey]:
        """Explicit force only: downstream rows → stale, their checkpoints archived + marked."""
        targets = self.downstream_keys(key)
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

    def _victim_runtime(self, victim: str) -> "StepRuntime":
        return StepRuntime(
            self.steps[victim],
            steps=self.steps,
            settings=self.settings,
            ledger=self.ledger,
            checkpoints=self.checkpoints,
        )

    def _prepare_edits(
        self,
        key: StepKey,
        run: RunInfo,
        mutations: Sequence[Mutation],
        inputs: Mapping[str, Checkpoint | None],
    ) -> list[PreparedEdit]:
        """Every declared victim's intent, each edit built on the victim the mutator read,
        validated and verified. Writes nothing (SPEC §7: zero fixes = zero writes)."""
        by_victim: dict[str, Mutation] = {}
        for mutation in mutations:
            if mutation.victim not in self.step.modifies_checkpoints:
                raise PipelineError(
                    "step.mutation_rejected",
                    f"{key}: {mutation.victim} is not declared in modifies_checkpoints",
                )
            by_victim[mutation.victim] = mutation
        edits = []
        for victim in self.step.modifies_checkpoints:
            victim_key = StepKey(key.project_id, key.episode_id, victim)
            read = inputs.get(victim) or self.checkpoints.load(victim_key)
            mutation = by_victim.get(victim)
            if read is None:
                if mutation is not None:
                    raise PipelineError(
                        "step.mutation_rejected", f"{key}: victim {victim_key} has no checkpoint"
                    )
                continue
            edited = read
            if mutation is not None and dict(read.data) != dict(mutation.data):
                edited = self._edited_victim(key, run, mutation, read)
            intent = Intent(victim, read.content_hash, edited.content_hash)
            edits.append(PreparedEdit(intent, edited))
        return edits

    def _edited_victim(
        self, key: StepKey, run: RunInfo, mutation: Mutation, read: Checkpoint
    ) -> Checkpoint:
        victim_key = read.key
        record = {
            "by_step": key.step_id,
            "run_id": run.run_id,
            "at": format_timestamp(self.clock()),
            "fields": list(mutation.fields),
            "origin": mutation.note,
        }
        edited = read.with_changes(data=dict(mutation.data), mutations=(*read.mutations, record))
        victim = self._victim_runtime(mutation.victim)
        try:
            victim.step.validate_data(
                edited.data, source=str(self.checkpoints.path_for(victim_key))
            )
        except PipelineError as exc:
            raise PipelineError(
                "step.mutation_rejected",
                f"{key}: edit of {victim_key} rejected: {exc.message}",
                origin=exc.origin,
            ) from exc
        report = victim.verify(victim.context(victim_key), edited)
        if not report.is_complete:
            raise PipelineError(
                "step.mutation_rejected",
                f"{key}: edited {victim_key} would not verify "
                f"({report.origin}: {list(report.missing)[:3]}); left unchanged",
                origin=report.origin.value if report.origin else None,
            )
        return edited

    def _settle(
        self,
        key: StepKey,
        run: RunInfo,
        intents: Sequence[Intent],
        checkpoint: Checkpoint,
        ctx: StepContext,
        *,
        reseal: bool,
    ) -> tuple[str, ...]:
        """Apply the written-ahead edits (compare-and-set), audit them; ``reseal`` the
        mutator's published row (its seal names the victims' files)."""

        def seal_for(edited: Checkpoint, temp: str) -> str | None:
            # The edit was verified clean: sealed like a publish (the old seal named the
            # replaced file).
            victim = self._victim_runtime(edited.step_id)
            return self.checkpoints.seal(
                edited,
                victim.verifier_reads(victim.context(edited.key)),
                file=Path(temp),
                revision=victim.step.verify_revision,
            )

        def applied(intent: Intent, before: Checkpoint, after: Checkpoint) -> None:
            self._reverify_victim(key, before, after)
            fields = list(after.mutations[-1].get("fields", [])) if after.mutations else []
            note = after.mutations[-1].get("origin") if after.mutations else None
            self.ledger.append_transition(
                after.key,
                action="mutated",
                from_status=None,
                to_status=None,
                reason=f"{note or 'edited'} by {key.step_id}: fields {fields}",
                run_id=run.run_id,
                launch_path=run.launch_path,
            )

        written = settle(
            self.checkpoints, self.ledger, key, intents, seal_for=seal_for, on_applied=applied
        )
        if reseal and written:
            # The mutator's seal covers its victims' files: renew it now they hold the edits.
            seal = self.checkpoints.seal(
                checkpoint, self.verifier_reads(ctx), revision=self.step.verify_revision
            )
            self.ledger.with_settled_row(key, lambda: None, reseal=True, seal=seal)
        return tuple(written)

    def _reverify_victim(self, key: StepKey, before: Checkpoint, after: Checkpoint) -> None:
        """Re-verify what is on disk now; roll back to the version read if it does not hold."""
        victim = self._victim_runtime(after.step_id)
        reloaded = self.checkpoints.load(after.key)
        report = victim.verify(victim.context(after.key), reloaded) if reloaded else None
        if report is not None and report.is_complete:
            return
        restore = self.checkpoints.stage(before)
        try:
            self.ledger.with_settled_row(after.key, restore.commit, reseal=True, seal=None)
        finally:
            restore.discard()
        raise PipelineError(
            "step.mutation_rejected",
            f"{key}: {after.key} failed re-verification after the edit; rolled back",
        )

    def _settle_published(
        self, key: StepKey, run: RunInfo, decision: ResumeDecision, state: dict[str, bool]
    ) -> StepOutcome | None:
        """A published mutator checkpoint whose edits are written ahead but not all applied
        (the process died while settling): apply them instead of reviewing again. None when
        that is not possible (no intents, or a victim changed since): review again."""
        existing, broken = self.load_checkpoint(key)
        if existing is None or broken is not None or existing.status != "completed":
            return None
        intents = intents_of(existing, source=str(self.checkpoints.path_for(key)))
        for intent in intents:
            victim_key = StepKey(key.project_id, key.episode_id, intent.victim)
            current, _ = self.load_checkpoint(victim_key)
            found = current.content_hash if current is not None else None
            pending = self.checkpoints.load_pending(key, intent.victim)
            ready = pending is not None and pending.content_hash == intent.result
            if found != intent.result and not (found == intent.base and ready):
                return None
        if not intents:
            return None
        ctx = self.context(key, run_id=run.run_id)
        report = self.verify(ctx, existing)
        if not report.is_complete:
            return None
        state["recorded"] = False
        mutated = self._settle(key, run, intents, existing, ctx, reseal=False)
        reads = self.verifier_reads(ctx)
        summary = f"settled the written-ahead edits of {', '.join(mutated) or 'no victim'}"
        if not self._publish(key, run, "completed", existing, summary, {}, reads):
            raise PipelineError(
                "step.ownership_lost", f"{key}: run {run.run_id} lost its claim; nothing published"
            )
        state["recorded"] = True
        self.audit(
            key, run, decision, action="finish", from_status="running", to_status="completed",
            reason=summary,
        )  # fmt: skip
        self.ledger.reset_recovery(key, run.run_id)
        crash_point("finished", key.step_id)
        return StepOutcome(decision, "completed", existing, mutated=mutated, report=report)
