"""The read-only judge of one step: what a run, the sensor, ``status`` and ``decide`` ask.

It gathers the inputs of the pure table (``resume.decision.decide``): the project's scoped
config, the checkpoint (loaded and validated, or a seal that still holds), the step's
verifier (lazily), whether a dead owner's run has ended, and calls it. It has no method
that writes: claiming, publishing and invalidating live in ``steps.runner``, which uses a
judge. Dagster-free.
"""

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline_defs.project import ProjectConfig, load_project_config, scoped_fingerprints
from pipeline_defs.resume.completion import CompletionReport, Origin, Severity, merge_reports
from pipeline_defs.resume.decision import (
    CLAIMING_ACTIONS,
    CODE_RESUME_BLOCKED,
    CheckpointSummary,
    LaunchMode,
    ResumeAction,
    ResumeDecision,
    ScopedConfig,
    decide,
)
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.steps.mutations import intent_report
from pipeline_defs.steps.spec import Step
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.seal import Seal
from resources.checkpoints.store import SYMLINK_CODE, CheckpointStore
from resources.ledger.store import LedgerStore

Loaded = tuple[Checkpoint | None, PipelineError | None]  # a checkpoint, or why it is unusable

_SEALED_CLEAN = CompletionReport.clean(sealed=True)


def _sealed_clean() -> CompletionReport:
    """The verdict a holding seal stands for (one shared, immutable report)."""
    return _SEALED_CLEAN


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Judgement:
    """A decision plus what it was made from (for SKIP outputs and reporting)."""

    key: StepKey
    decision: ResumeDecision
    checkpoint: Checkpoint | None
    row: Mapping[str, Any] | None


class ProjectConfigs:
    """Project configs by project id, and a step's scoped view of one.

    This one reads ``project.yaml`` whenever asked (a run asks a few times); batch
    judgement passes one that keeps them while the file is unchanged
    (``judging.evaluation``). Judges of one code location may share it.
    """

    def __init__(self, home: Path | str) -> None:
        self.home = Path(home)

    def get(self, project_id: str) -> ProjectConfig:
        return load_project_config(self.home, project_id)

    def scoped(self, project: ProjectConfig, keys: tuple[str, ...]) -> ScopedConfig:
        return ScopedConfig(scoped_fingerprints(project.as_dict(), keys))


class StepJudge:
    """One step bound to its stores, judged for a partition. Reads only."""

    def __init__(
        self,
        step: Step,
        *,
        graph: StepGraph,
        settings: ResumeSettings,
        ledger: LedgerStore,
        checkpoints: CheckpointStore,
        projects: ProjectConfigs | None = None,
        log: logging.Logger | None = None,
        clock: Callable[[], datetime] = utc_now,
        owner_ended: Callable[[str], str | None] | None = None,
    ) -> None:
        self.step = step
        self.graph = graph
        self.settings = settings
        # Only handed to the step's context (its verifier may read rows); never written here.
        self.ledger = ledger
        self.checkpoints = checkpoints
        self.projects = projects or ProjectConfigs(checkpoints.home)
        self.log = log or logging.getLogger(f"storyboard.{step.step_id}")
        self.clock = clock
        # Owner token -> the terminal state of its Dagster run, if it has ended (evidence of
        # a dead lease that needs no waiting; None where no Dagster instance is at hand).
        self.owner_ended = owner_ended

    def for_step(self, step_id: str) -> "StepJudge":
        """The judge of another step of the graph on the same stores (a mutator's victim)."""
        return StepJudge(
            self.graph.step(step_id),
            graph=self.graph,
            settings=self.settings,
            ledger=self.ledger,
            checkpoints=self.checkpoints,
            projects=self.projects,
        )

    # ------------------------------------------------------------------ inputs
    def key(self, partition_key: str) -> StepKey:
        return Episode.parse(partition_key).step(self.step.step_id)

    def project(self, key: StepKey) -> ProjectConfig:
        return self.projects.get(key.project_id)

    def context(self, key: StepKey) -> StepContext:
        """The context a verifier sees: no owner, no providers."""
        return StepContext(
            key=key,
            project=self.project(key),
            checkpoints=self.checkpoints,
            ledger=self.ledger,
            log=self.log,
        )

    def scoped_config(self, project: ProjectConfig) -> ScopedConfig:
        return self.projects.scoped(project, self.step.resume_config_keys)

    def downstream_keys(self, key: StepKey) -> list[StepKey]:
        """This step's transitive dependents in ``key``'s episode (declaration order)."""
        return [
            StepKey(key.project_id, key.episode_id, s)
            for s in self.graph.downstream(self.step.step_id)
        ]

    def load_checkpoint(self, key: StepKey) -> Loaded:
        try:
            return self.checkpoints.load(key), None
        except PipelineError as exc:
            return None, exc

    # ------------------------------------------------------------------ verifying
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

    # ------------------------------------------------------------------ judging
    def judge(
        self,
        key: StepKey,
        *,
        mode: LaunchMode,
        row: Mapping[str, Any] | None,
        now: datetime | None = None,
        loaded: Loaded | None = None,
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
        typed = LedgerRow.of(row)
        ended = (
            self.owner_ended(str(typed.run_id))
            if self.owner_ended is not None and typed is not None and typed.is_running
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
        loaded: Loaded | None,
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
