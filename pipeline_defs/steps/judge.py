"""The read-only judge of one step: what a run, the sensor, ``status`` and ``decide`` ask.

It gathers the inputs of the pure table (``resume.decision.decide``): the project's scoped
config, the checkpoint (loaded and validated, or a seal that still holds), the step's
verifier (lazily), whether a dead owner's run has ended, and calls it. Read-only by type:
it holds the stores' readers (``steps.readers``: ``LedgerReader``, ``CheckpointReader``)
and hands verifiers a ``VerifyContext``, so it cannot call a writing method; claiming,
publishing and invalidating live in ``steps.runner``, which holds the full stores and uses
a judge. Dagster-free.
"""

import logging
import os
import posixpath
import stat as stat_module
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline_defs.project import (
    ProjectConfig,
    load_project_config,
    project_config_path,
    scoped_fingerprints,
)
from pipeline_defs.resume.budget import Budget, CallCap, cap_in_force
from pipeline_defs.resume.completion import CompletionReport, Origin, Severity, merge_reports
from pipeline_defs.resume.decision import decide
from pipeline_defs.resume.decision_types import (
    CheckpointSummary,
    InTheWay,
    LaunchMode,
    ResumeAction,
    ResumeDecision,
    ScopedConfig,
)
from pipeline_defs.resume.errors import ErrorCode, OutageError, PipelineError, SymlinkRefused
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow, StepStatus
from pipeline_defs.steps.context import VerifyContext
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.steps.mutations import intent_report
from pipeline_defs.steps.readers import CheckpointReader, LedgerReader
from pipeline_defs.steps.spec import Step
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.seal import Seal

Loaded = tuple[Checkpoint | None, PipelineError | None]  # a checkpoint, or why it is unusable

_SEALED_CLEAN = CompletionReport.clean(sealed=True)

# The code of a checkpoint that is not a regular file or not the recorded bytes
# (``CheckpointStore.load``), used the same way for the files a checkpoint lists.
INTEGRITY_CODE = ErrorCode.IO_INTEGRITY_VIOLATION
_KINDS = (
    (stat_module.S_ISDIR, "a directory"),
    (stat_module.S_ISFIFO, "a FIFO"),
    (stat_module.S_ISSOCK, "a socket"),
    (stat_module.S_ISCHR, "a character device"),
    (stat_module.S_ISBLK, "a block device"),
)


def not_a_file_error(path: str | os.PathLike[str], mode: int, what: str) -> PipelineError:
    """The typed refusal of something that is not a regular file where ``what`` should be.

    A writer would only find out after its provider call (``os.replace`` onto a directory
    raises, onto a FIFO it silently replaces it) and a reader may hang on a FIFO: so the
    judge blocks on it before any claim, and a step checks again before any call.
    """
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    return PipelineError(
        INTEGRITY_CODE,
        f"{path} is {kind}, not a regular file, where {what} should be "
        f"[{INTEGRITY_CODE}]: nothing is drawn, written or replaced there and it is left in "
        "place; move it away (or remove it) to go on",
        origin=Origin.CONTRACT_DRIFT.value,
        details={"path": str(path)},
    )


def not_a_file(
    checkpoints: CheckpointReader, key: StepKey, relatives: Iterable[str], what: str
) -> PipelineError | None:
    """The refusal for the first of ``relatives`` (paths in ``key``'s step directory) that
    exists and is not a regular file; None when each is a regular file or absent (a link on
    the way raises ``checkpoint.symlink``, the caller's own block)."""
    found = checkpoints.not_regular(key, relatives)
    return None if found is None else not_a_file_error(*found, what)


# The launch path of runs the resume sensor requests (``wiring.assets.launch_path``): the
# only automatic launcher. Only its recoveries count toward ``max_recovery_attempts``.
AUTOMATIC_LAUNCH_PATH = "sensor"


def input_problem(
    step: Step, checkpoints: CheckpointReader, checkpoint: Checkpoint
) -> PipelineError | None:
    """Why ``step``'s published ``checkpoint`` cannot be handed to a downstream step as it
    is (the IO manager asks this for every input): written under another schema (contract
    drift), an artifact missing or not the published bytes, or data the step no longer
    accepts. None when it can (a not-applicable one always can: its data is empty by
    design). The run's own judgement of the upstream step, with its decision, is the
    step's gate; this is the last word on the bytes a step is about to read."""
    if checkpoint.status == StepStatus.NOT_APPLICABLE:
        return None
    path = str(checkpoints.path_for(checkpoint.key))
    if checkpoint.schema_version != step.schema_version:
        return PipelineError(
            ErrorCode.IO_INTEGRITY_VIOLATION,
            f"checkpoint {path}: schema_version {checkpoint.schema_version} but {step.step_id} "
            f"now writes {step.schema_version}",
            origin=Origin.CONTRACT_DRIFT.value,
            details={"path": path},
        )
    missing, changed = checkpoints.artifact_problems(checkpoint)
    if missing or changed:
        origin = Origin.INVARIANT_DRIFT if changed else Origin.ARTIFACT_MISSING
        return PipelineError(
            ErrorCode.IO_INTEGRITY_VIOLATION,
            f"checkpoint {path}: artifacts missing or changed: {[*changed, *missing][:5]}",
            origin=origin.value,
            details={"path": path},
        )
    try:
        step.validate_data(checkpoint.data, source=path)
    except PipelineError as error:
        return error
    return None


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
    row: LedgerRow | None


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
    """One step bound to its stores' readers, judged for a partition. Reads only, by type."""

    def __init__(
        self,
        step: Step,
        *,
        graph: StepGraph,
        settings: ResumeSettings,
        ledger: LedgerReader,
        checkpoints: CheckpointReader,
        projects: ProjectConfigs | None = None,
        log: logging.Logger | None = None,
        clock: Callable[[], datetime] = utc_now,
        owner_ended: Callable[[str], str | None] | None = None,
    ) -> None:
        self.step = step
        self.graph = graph
        self.settings = settings
        # Readers only: handed to the verifier's context (it may read rows). A run's writes
        # go through the full stores its ``StepRunner`` holds, never through a judge.
        self.ledger: LedgerReader = ledger
        self.checkpoints: CheckpointReader = checkpoints
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
        # On object storage the home holds a copy of the published project config, brought
        # up to date first (at most one request per project every few seconds; a no-op on
        # a local home): a sealed verdict compares the config it finds here.
        self.checkpoints.sync_inputs(key.project_id)
        return self.projects.get(key.project_id)

    def context(self, key: StepKey) -> VerifyContext:
        """The context a verifier sees: readers only, no owner, no providers, no writer."""
        return VerifyContext(
            key=key,
            project=self.project(key),
            checkpoints=self.checkpoints,
            ledger=self.ledger,
            log=self.log,
        )

    def call_cap(self, key: StepKey, project: ProjectConfig) -> CallCap:
        """The spend cap of ``key``'s episode: the project's own, else the setting's (with
        the episode's estimate, read only when a refusal's suggestion is worded)."""
        ledger = self.ledger
        return cap_in_force(
            self.settings.max_calls_per_episode,
            self.settings.max_calls_source,
            project.budget.max_calls_per_episode,
            str(project_config_path(self.checkpoints.home, key.project_id)),
            lambda: ledger.episode_estimate(key.project_id, key.episode_id),
        )

    def budget(self, key: StepKey, project: ProjectConfig) -> Budget:
        """The spend fact of ``decide``: the cap, and the episode's recorded calls (read
        from the ledger only if the verdict would claim)."""
        ledger = self.ledger
        return Budget(
            lambda: self.call_cap(key, project),
            lambda: ledger.episode_calls(key.project_id, key.episode_id),
            key.project_id,
            key.episode_id,
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
        except OutageError:  # the storage down says nothing of the checkpoint
            raise
        except PipelineError as exc:
            return None, exc

    # ------------------------------------------------------------------ verifying
    def verify(self, ctx: VerifyContext, checkpoint: Checkpoint) -> CompletionReport:
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

    def verifier_reads(self, ctx: VerifyContext) -> tuple[Path, ...]:
        """What a verdict of this step may depend on besides its checkpoint and artifacts:
        the episode's input directory and files, and ``Step.verify_reads``.

        Not the project config: the judge compares the step's scoped config itself, and an
        edit of an unrelated key must not void every seal of the project.
        """
        inputs = ctx.episode_dir
        files = self.checkpoints.episode_input_files(ctx.key)
        victims = [
            self.checkpoints.path_for(StepKey(ctx.key.project_id, ctx.key.episode_id, v))
            for v in self.step.modifies_checkpoints
        ]
        return tuple(dict.fromkeys([inputs, *files, *self.step.verify_reads(ctx), *victims]))

    def refuse_links_to_write(self, key: StepKey, action: ResumeAction) -> None:
        """``checkpoint.symlink`` if a step directory this claiming run may write in holds a
        link anywhere (docs/DESIGN.md#no-escape): its own (pending, archive, artifacts) and, for an
        explicit force, every downstream one it will invalidate and clear.

        The judge checks this for every claiming decision (a block before the claim, any
        cleanup or provider call); the writers check again when they write. Checking all
        of them first is what keeps a refusal from leaving half a force behind (rows
        staled, a provider call paid).
        """
        targets = [key]
        if action is ResumeAction.FORCE_EXPLICIT:
            targets += self.downstream_keys(key)
        for target in targets:
            self.checkpoints.refuse_links_in_tree(target)

    def not_a_file(self, key: StepKey, checkpoint: Checkpoint | None) -> PipelineError | None:
        """Something that is not a regular file (a directory, a FIFO, …) where an artifact
        of ``key``'s checkpoint, or a file named after one (its receipt), should be."""
        if checkpoint is None or not checkpoint.artifacts:
            return None
        relatives = self.checkpoints.with_companions(key, [a.path for a in checkpoint.artifacts])
        return not_a_file(self.checkpoints, key, relatives, f"a file of {key.step_id}'s checkpoint")

    def older_copy(self, key: StepKey, checkpoint: Checkpoint | None) -> PipelineError | None:
        """An artifact of ``key``'s checkpoint whose bytes are not the recorded ones but those
        of one of its archived copies: an older version put back by hand.

        On a completed row the verifier blocks on any other bytes; a failed or partial row
        is re-run without verifying, and an image step then adopts a picture its receipt
        vouches for, an older one included. A picture a killed run drew (and placed, never
        published) is never in the archive: only what was replaced is. Hashes only the
        artifacts that have archived copies (``CheckpointStore.archive_artifact`` names them
        ``<sha256[:16]>-<name>``).
        """
        if checkpoint is None or not checkpoint.artifacts:
            return None
        archived = self.checkpoints.archived_artifacts(key)
        if not archived:
            return None
        archive = self.checkpoints.layout.archive_in(self.checkpoints.step_dir(key))
        for artifact in checkpoint.artifacts:
            copies = archived.get(posixpath.basename(artifact.path))
            if not copies:
                continue
            found = self.checkpoints.artifact_sha256(key, artifact.path)
            if found is None:
                continue  # absent: re-drawn; not a file: ``not_a_file`` reports it
            if found != artifact.sha256 and found[:16] in copies:
                path = self.checkpoints.artifact_path(key, artifact.path)
                return PipelineError(
                    INTEGRITY_CODE,
                    f"{path} holds an older copy of it (sha256 {found[:16]}…, as archived in "
                    f"{archive}), not the {artifact.sha256[:16]}… the checkpoint of "
                    f"{key.step_id} records: nothing is adopted silently; move it away to "
                    "have it drawn again, or force the step to adopt it",
                    origin=Origin.INVARIANT_DRIFT.value,
                    details={"path": str(path)},
                )
        return None

    # ------------------------------------------------------------------ judging
    def judge(
        self,
        key: StepKey,
        *,
        mode: LaunchMode,
        row: LedgerRow | None,
        now: datetime | None = None,
        loaded: Loaded | None = None,
        sealed: Seal | None = None,
    ) -> Judgement:
        """Gather the inputs of ``decide`` and call it. Reads only; never writes.

        ``sealed``: a seal of this key's checkpoint that still holds (read-only judges):
        the publishing run's clean verification stands in for reading and verifying again.
        """
        # On object storage the inputs are copied into the home first (a cache; no-op and
        # no request on a local home or within a few seconds of the last copy). A holding
        # seal stands for the episode's inputs (the scrub compares them with the storage):
        # only the project config, which the judge compares itself, is brought up to date.
        self.checkpoints.sync_inputs(key.project_id, key.episode_id if sealed is None else None)
        ctx = self.context(key)
        config = self.scoped_config(ctx.project)
        if sealed is None and loaded is None:
            loaded = self.load_checkpoint(key)
        checkpoint, summary, verify = self._evidence(ctx, config, loaded, sealed)
        ended = (
            self.owner_ended(str(row.run_id))
            if self.owner_ended is not None and row is not None and row.is_running
            else None
        )

        def probe(action: ResumeAction, auto_recovery: bool) -> PipelineError | None:
            """What stands where a claiming run would write (read-only file probes)."""
            try:  # a link anywhere in its way blocks it first
                self.refuse_links_to_write(key, action)
            except SymlinkRefused as exc:
                return exc
            found = self.not_a_file(key, checkpoint)
            if found is None and auto_recovery:
                found = self.older_copy(key, checkpoint)
            return found

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
            in_the_way=InTheWay(unreadable=loaded[1] if loaded is not None else None, probe=probe),
            budget=self.budget(key, ctx.project),
        )
        return Judgement(key, decision, checkpoint, row)

    def _evidence(
        self,
        ctx: VerifyContext,
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
                status=StepStatus.COMPLETED,
                config_hash=config.hash,
                config_fingerprints=dict(config.fingerprints),
                unusable=True,
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
