"""A mutator and its edits are one recoverable unit (docs/DESIGN.md#review): the intents,
their write-ahead and the settlement a re-run may resume. Applying the edits to the victims
is :mod:`pipeline_defs.steps.mutator_edits`.

A mutator (``Step.modifies_checkpoints``) edits other steps' checkpoints in place. Its run
used to publish its own checkpoint first and edit the victims afterwards: a process killed
in between left the mutator ``completed`` with its fixes never applied, and a later resume
skipped everything. Now:

1. **prepare** (no writes): each edit is built on the victim the mutator *read* (its content
   hash is the intent's ``base``), validated and verified; its content hash is ``result``.
   A victim the mutator left alone gets ``base == result``.
2. **write ahead**: every edit that changes something is written to the mutator's
   ``pending/<victim>.json``, then the checkpoint the mutator is about to publish to
   ``pending/<mutator>.json`` (last: its presence means every edit is durable).
3. the mutator **publishes** its checkpoint, whose data carries the intents under
   ``INTENTS_KEY``. From here on the intents are the truth about what the review expects.
4. **settle**: each victim is a compare-and-set under its row lock: at ``base`` → the
   pending edit replaces it; at ``result`` → already applied; anything else →
   ``mutation.victim_changed`` and nothing written. The edit, the victim's new seal and its
   history line commit together, and a refused edit leaves an ``edit_refused`` line
   (:mod:`pipeline_defs.steps.mutator_edits`, docs/DESIGN.md#audit).

Judging (read-only, :func:`intent_report`): a mutator whose every victim is at its
``result`` is clean. A victim at ``base`` (the process died before settling) or at any
other version (rebuilt since the review) makes it incomplete (``artifact_missing``), so the
judge re-runs the mutator alone. That re-run first settles what the write-ahead edits
allow, with no provider call (each fix is applied exactly once): from the published
checkpoint, or, when the process died before publishing it, from the written-ahead copy
(docs/DESIGN.md#write-ahead). Only when a victim changed since the review does it review again.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pipeline_defs.project import ProjectConfig
from pipeline_defs.resume.completion import CompletionReport, Origin, Severity
from pipeline_defs.resume.decision_types import ScopedConfig
from pipeline_defs.resume.errors import ErrorCode, IntegrityViolation, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.context import StepContext, VerifyContext
from pipeline_defs.steps.faults import crash_point
from pipeline_defs.steps.readers import CheckpointReader
from pipeline_defs.steps.spec import Step
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.store import CheckpointStore

INTENTS_KEY = "mutation_intents"


@dataclass(frozen=True)
class Intent:
    """What the mutator expects of one victim: read at ``base``, leaves it at ``result``."""

    victim: str
    base: str
    result: str

    def as_dict(self) -> dict[str, str]:
        return {"base": self.base, "result": self.result}


@dataclass(frozen=True)
class PreparedEdit:
    """An edited victim envelope, verified, not yet written."""

    intent: Intent
    edited: Checkpoint


def intents_of(checkpoint: Checkpoint, *, source: str) -> list[Intent]:
    """The intents a published mutator checkpoint carries (none for an old checkpoint)."""
    raw = checkpoint.data.get(INTENTS_KEY)
    if raw is None:
        return []
    try:
        return [
            Intent(str(victim), str(entry["base"]), str(entry["result"]))
            for victim, entry in dict(raw).items()
        ]
    except (TypeError, ValueError, KeyError) as exc:
        raise PipelineError(
            ErrorCode.CHECKPOINT_INVALID,
            f"{source}: field 'data.{INTENTS_KEY}' is malformed ({type(exc).__name__}: {exc})",
            origin=Origin.CONTRACT_DRIFT.value,
        ) from exc


def held_intents(
    previous: Checkpoint | None, victims: Mapping[str, Checkpoint | None]
) -> dict[str, Intent]:
    """The intents of a mutator's ``previous`` checkpoint that its victims still hold (the
    victim's checkpoint is the version the edits left it at), by victim.

    A mutator re-run because one victim was rebuilt reviews that one again and keeps what
    the others hold, so the run ends as a clean run would.
    """
    if previous is None:
        return {}
    try:
        intents = intents_of(previous, source=str(previous.key))
    except PipelineError:
        return {}  # a malformed record holds nothing: everything is reviewed again
    held = {}
    for intent in intents:
        current = victims.get(intent.victim)
        if current is not None and current.content_hash == intent.result:
            held[intent.victim] = intent
    return held


def _blocked_victim(victim: str, mutator: str, exc: PipelineError) -> str:
    """A victim the mutator cannot read, as the operator should read it: the victim is
    blocked (its own judgement says why and what to do) and the mutator waits on it."""
    if isinstance(exc, IntegrityViolation):
        way_out = f"accept the edit (storyboard accept) or force a rebuild of {victim}"
        what = "edited outside the pipeline, so it is blocked"
    else:
        way_out = f"repair or force a rebuild of {victim}"
        what = "unreadable, so it is blocked"
    return f"{victim}: {what} ({exc.code}); {mutator} waits on it: {way_out}"


def intent_report(
    checkpoints: CheckpointReader, mutator: StepKey, checkpoint: Checkpoint
) -> CompletionReport:
    """Whether every victim holds the version the published mutator left it at."""
    problems: list[str] = []
    unapplied = False  # a victim at base: the mutator's own edits are what is missing
    source = str(checkpoints.path_for(mutator))
    for intent in intents_of(checkpoint, source=source):
        victim_key = StepKey(mutator.project_id, mutator.episode_id, intent.victim)
        try:
            current = checkpoints.load(victim_key)
        except PipelineError as exc:  # the victim's own judgement reports how it is broken
            problems.append(_blocked_victim(intent.victim, mutator.step_id, exc))
            continue
        found = current.content_hash if current is not None else None
        if found == intent.result:
            continue
        if found is None:
            problems.append(f"{intent.victim}: no checkpoint; review again once it is rebuilt")
        elif found == intent.base:
            unapplied = True
            problems.append(f"{intent.victim}: the edits of {mutator.step_id} are not applied")
        else:
            problems.append(
                f"{intent.victim}: changed since {mutator.step_id} reviewed it (an accepted "
                "edit or a rebuild); review again"
            )
    if not problems:
        return CompletionReport.clean()
    # Edits never applied are the mutator's own result missing; a victim changed since (an
    # accepted hand edit, a rebuild), gone or blocked is no missing artifact of the mutator
    # (docs/DESIGN.md#rebuilt-victims): either way it alone runs again.
    origin = Origin.ARTIFACT_MISSING if unapplied else Origin.VICTIM_CHANGED
    return CompletionReport.incomplete(origin, tuple(problems), Severity.PARTIAL)


def write_ahead(
    checkpoints: CheckpointStore,
    mutator: StepKey,
    edits: Sequence[PreparedEdit],
    checkpoint: Checkpoint,
) -> None:
    """Write every edit that changes a victim ahead, then ``checkpoint`` (what the mutator
    publishes next): a process killed before its publish leaves the whole result of its
    paid review behind, to be published and settled by the next run with no call.
    Zero fixes write nothing (docs/DESIGN.md#review)."""
    changed = [e for e in edits if e.intent.base != e.intent.result]
    for edit in changed:
        checkpoints.write_pending(mutator, edit.edited)
    if changed:
        checkpoints.write_pending(mutator, checkpoint)  # pending/<mutator>.json
    crash_point("mutation.pending_written", mutator.step_id)


def drop_written_ahead(checkpoints: CheckpointStore, mutator: StepKey) -> None:
    """Forget the mutator's own written-ahead checkpoint once its row holds a result."""
    checkpoints.drop_pending(mutator, mutator.step_id)


def intents_data(data: Mapping[str, Any], intents: Sequence[Intent]) -> dict[str, Any]:
    """The mutator's data with its intents (part of its content: a review of another victim
    version is another result)."""
    return {**data, INTENTS_KEY: {i.victim: i.as_dict() for i in intents}}


# --------------------------------------------------------------------------- settlement
class Verifier(Protocol):
    """What a mutator's edits and their settlement ask of a step's read-only judge
    (``steps.judge.StepJudge``)."""

    step: Step

    def context(self, key: StepKey) -> VerifyContext: ...

    def verify(self, ctx: VerifyContext, checkpoint: Checkpoint) -> CompletionReport: ...

    def verifier_reads(self, ctx: VerifyContext) -> tuple[Path, ...]: ...

    def project(self, key: StepKey) -> ProjectConfig: ...

    def scoped_config(self, project: ProjectConfig) -> ScopedConfig: ...

    def load_checkpoint(self, key: StepKey) -> tuple[Checkpoint | None, PipelineError | None]: ...

    def for_step(self, step_id: str) -> "Verifier": ...


@dataclass(frozen=True)
class Settlement:
    """A published mutator checkpoint whose written-ahead edits can be applied as they are
    (the process died while settling): no review, no provider call."""

    checkpoint: Checkpoint
    intents: tuple[Intent, ...]
    report: CompletionReport  # the mutator's own verification, clean
    ctx: StepContext
    # True: ``checkpoint`` is the written-ahead copy of a run killed before it published;
    # the settling run publishes it first, then applies the edits, as that run would have.
    written_ahead: bool = False


def find_settlement(
    judge: Verifier,
    checkpoints: CheckpointStore,
    key: StepKey,
    ctx_for: Callable[[], StepContext],
) -> Settlement | None:
    """Edits written ahead but not all applied, that can be applied as they are (no
    review, no provider call): those of the published mutator checkpoint (the process
    died while settling), else those of the checkpoint written ahead with them (it died
    before publishing). None when neither holds (no intents, a victim changed since, a
    config change, it no longer verifies): the mutator reviews again.
    ``ctx_for`` builds the run's context once the intents allow a settlement."""
    existing, broken = judge.load_checkpoint(key)
    if existing is not None and broken is None and existing.status == StepStatus.COMPLETED:
        found = _settleable(judge, checkpoints, key, existing, ctx_for, written_ahead=False)
        if found is not None:
            return found
    ahead = checkpoints.load_pending(key, key.step_id)
    if ahead is None or ahead.key != key or ahead.status != StepStatus.COMPLETED:
        return None
    if existing is not None and ahead.content_hash == existing.content_hash:
        return None  # the published one, judged above
    # What a review now would be judged against: the same contract and scoped config
    # (the victims, its only inputs, are compared by the intents).
    config = judge.scoped_config(judge.project(key))
    if (ahead.schema_version, ahead.config_hash) != (
        judge.step.schema_version,
        config.hash,
    ):
        return None
    return _settleable(judge, checkpoints, key, ahead, ctx_for, written_ahead=True)


def _settleable(
    judge: Verifier,
    checkpoints: CheckpointStore,
    key: StepKey,
    checkpoint: Checkpoint,
    ctx_for: Callable[[], StepContext],
    *,
    written_ahead: bool,
) -> Settlement | None:
    source = str(checkpoints.path_for(key))
    try:
        intents = intents_of(checkpoint, source=source)
    except PipelineError:
        if written_ahead:
            return None  # a malformed copy offers nothing: review again
        raise
    for intent in intents:
        victim_key = StepKey(key.project_id, key.episode_id, intent.victim)
        current, _ = judge.load_checkpoint(victim_key)
        found = current.content_hash if current is not None else None
        pending = checkpoints.load_pending(key, intent.victim)
        ready = pending is not None and pending.content_hash == intent.result
        if found != intent.result and not (found == intent.base and ready):
            return None
    if not intents:
        return None
    ctx = ctx_for()
    report = judge.verify(ctx, checkpoint)
    if not report.is_complete:
        return None
    return Settlement(checkpoint, tuple(intents), report, ctx, written_ahead=written_ahead)
