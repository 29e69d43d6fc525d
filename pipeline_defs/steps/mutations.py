"""A mutator and its edits are one recoverable unit (docs/DESIGN.md#review).

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
   ``mutation.victim_changed`` and nothing written.

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
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from pipeline_defs.project import ProjectConfig
from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.completion import CompletionReport, Origin, Severity
from pipeline_defs.resume.decision import ScopedConfig
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.context import StepContext, VerifyContext
from pipeline_defs.steps.faults import crash_point
from pipeline_defs.steps.readers import CheckpointReader
from pipeline_defs.steps.spec import Mutation, Step
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.store import CheckpointStore, StagedCheckpoint
from resources.ledger.audit import AuditAction
from resources.ledger.store import LedgerStore

INTENTS_KEY = "mutation_intents"
VICTIM_CHANGED = ErrorCode.MUTATION_VICTIM_CHANGED


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
    if exc.code == ErrorCode.IO_INTEGRITY_VIOLATION:
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
            problems.append(f"{intent.victim}: the edits of {mutator.step_id} are not applied")
        else:
            problems.append(
                f"{intent.victim}: changed since {mutator.step_id} reviewed it (rebuilt?); "
                "review again"
            )
    if not problems:
        return CompletionReport.clean()
    return CompletionReport.incomplete(Origin.ARTIFACT_MISSING, tuple(problems), Severity.PARTIAL)


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


def settle(
    checkpoints: CheckpointStore,
    ledger: LedgerStore,
    mutator: StepKey,
    intents: Sequence[Intent],
    *,
    seal_for: Callable[[Checkpoint, str], str | None],
    on_applied: Callable[[Intent, Checkpoint, Checkpoint], None],
) -> list[str]:
    """Bring every victim to its intended version; returns the victims written.

    Raises ``mutation.victim_changed`` (nothing written for that victim) when a victim is
    neither at its base nor at its result, or when its write-ahead edit is missing.
    """
    written: list[str] = []
    for intent in intents:
        victim_key = StepKey(mutator.project_id, mutator.episode_id, intent.victim)
        current = checkpoints.load(victim_key)
        found = current.content_hash if current is not None else None
        if found == intent.result:
            checkpoints.drop_pending(mutator, intent.victim)
            continue
        pending = checkpoints.load_pending(mutator, intent.victim)
        if (
            current is None
            or found != intent.base
            or pending is None
            or pending.content_hash != intent.result
        ):
            raise PipelineError(
                VICTIM_CHANGED,
                f"{mutator}: {victim_key} is no longer the checkpoint {mutator.step_id} read "
                f"(expected {intent.base[:12]}, found {str(found)[:12]}); nothing written",
                status=409,
                origin=Origin.ARTIFACT_MISSING.value,
            )
        staged = checkpoints.stage(pending)  # archives the victim first
        try:
            seal = seal_for(pending, str(staged.temp))

            def compare_and_set(
                base: str = intent.base,
                key: StepKey = victim_key,
                staged: StagedCheckpoint = staged,
            ) -> None:
                # Under the victim's row lock: apply only to the version the mutator read.
                now = checkpoints.load(key)
                if now is None or now.content_hash != base:
                    raise PipelineError(
                        VICTIM_CHANGED,
                        f"{mutator}: {key} changed while its edit was being applied; "
                        "nothing written",
                        status=409,
                        origin=Origin.ARTIFACT_MISSING.value,
                    )
                staged.commit()

            ledger.with_settled_row(
                victim_key, compare_and_set, reseal=True, seal=seal, pointer=staged.pointer
            )
        finally:
            staged.discard()
        checkpoints.drop_pending(mutator, intent.victim)
        on_applied(intent, current, pending)
        written.append(intent.victim)
        crash_point("mutation.victim_written", mutator.step_id)
    return written


def intents_data(data: Mapping[str, Any], intents: Sequence[Intent]) -> dict[str, Any]:
    """The mutator's data with its intents (part of its content: a review of another victim
    version is another result)."""
    return {**data, INTENTS_KEY: {i.victim: i.as_dict() for i in intents}}


# --------------------------------------------------------------------------- a mutator's run
class Verifier(Protocol):
    """What applying edits asks of a step's read-only judge (``steps.judge.StepJudge``)."""

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


class MutatorEdits:
    """The run protocol's side of one mutator's edits (steps 1 and 4 above, and resuming a
    cut-short settle), for a run that holds the mutator's claim. Victims are verified by
    their own judges (``judge.for_step``)."""

    def __init__(
        self,
        judge: Verifier,
        *,
        ledger: LedgerStore,
        checkpoints: CheckpointStore,
        clock: Callable[[], datetime],
    ) -> None:
        self.judge = judge
        self.ledger = ledger
        self.checkpoints = checkpoints
        self.clock = clock

    def prepare(
        self,
        key: StepKey,
        run_id: str,
        mutations: Sequence[Mutation],
        inputs: Mapping[str, Checkpoint | None],
    ) -> list[PreparedEdit]:
        """Every declared victim's intent, each edit built on the victim the mutator read,
        validated and verified. Writes nothing (docs/DESIGN.md#review: zero fixes = zero writes).

        A victim the run does not edit that still holds the edits of the mutator's previous
        checkpoint keeps that intent (its base is the version before those edits), so a
        re-run records the same intents as the run whose edits it keeps."""
        declared = self.judge.step.modifies_checkpoints
        held = held_intents(self._previous(key), inputs)
        by_victim: dict[str, Mutation] = {}
        for mutation in mutations:
            if mutation.victim not in declared:
                raise PipelineError(
                    ErrorCode.STEP_MUTATION_REJECTED,
                    f"{key}: {mutation.victim} is not declared in modifies_checkpoints",
                )
            by_victim[mutation.victim] = mutation
        edits = []
        for victim in declared:
            victim_key = StepKey(key.project_id, key.episode_id, victim)
            read = inputs.get(victim) or self.checkpoints.load(victim_key)
            wanted = by_victim.get(victim)
            if read is None:
                if wanted is not None:
                    raise PipelineError(
                        ErrorCode.STEP_MUTATION_REJECTED,
                        f"{key}: victim {victim_key} has no checkpoint",
                    )
                continue
            kept = held.get(victim)
            if wanted is None and kept is not None and kept.result == read.content_hash:
                edits.append(PreparedEdit(kept, read))
                continue
            edited = read
            if wanted is not None and dict(read.data) != dict(wanted.data):
                edited = self._edited_victim(key, run_id, wanted, read)
            intent = Intent(victim, read.content_hash, edited.content_hash)
            edits.append(PreparedEdit(intent, edited))
        return edits

    def _previous(self, key: StepKey) -> Checkpoint | None:
        """The mutator's own published checkpoint, if it is readable (else nothing is kept)."""
        try:
            return self.checkpoints.load(key)
        except PipelineError:
            return None

    def _edited_victim(
        self, key: StepKey, run_id: str, mutation: Mutation, read: Checkpoint
    ) -> Checkpoint:
        victim_key = read.key
        record = {
            "by_step": key.step_id,
            "run_id": run_id,
            "at": format_timestamp(self.clock()),
            "fields": list(mutation.fields),
            "origin": mutation.note,
        }
        edited = read.with_changes(data=dict(mutation.data), mutations=(*read.mutations, record))
        victim = self.judge.for_step(mutation.victim)
        try:
            victim.step.validate_data(
                edited.data, source=str(self.checkpoints.path_for(victim_key))
            )
        except PipelineError as exc:
            raise PipelineError(
                ErrorCode.STEP_MUTATION_REJECTED,
                f"{key}: edit of {victim_key} rejected: {exc.message}",
                origin=exc.origin,
            ) from exc
        report = victim.verify(victim.context(victim_key), edited)
        if not report.is_complete:
            raise PipelineError(
                ErrorCode.STEP_MUTATION_REJECTED,
                f"{key}: edited {victim_key} would not verify "
                f"({report.origin}: {list(report.missing)[:3]}); left unchanged",
                origin=report.origin.value if report.origin else None,
            )
        return edited

    def settle(
        self,
        key: StepKey,
        intents: Sequence[Intent],
        checkpoint: Checkpoint,
        ctx: StepContext,
        *,
        run_id: str,
        launch_path: str,
        reseal: bool,
    ) -> tuple[str, ...]:
        """Apply the written-ahead edits (compare-and-set), audit them; ``reseal`` the
        mutator's published row (its seal names the victims' files)."""

        def seal_for(edited: Checkpoint, temp: str) -> str | None:
            # The edit was verified clean: sealed like a publish (the old seal named the
            # replaced file).
            victim = self.judge.for_step(edited.step_id)
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
                action=AuditAction.MUTATED,
                from_status=None,
                to_status=None,
                reason=f"{note or 'edited'} by {key.step_id}: fields {fields}",
                run_id=run_id,
                launch_path=launch_path,
            )

        written = settle(
            self.checkpoints, self.ledger, key, intents, seal_for=seal_for, on_applied=applied
        )
        if reseal and written:
            # The mutator's seal covers its victims' files: renew it now they hold the edits.
            seal = self.checkpoints.seal(
                checkpoint, self.judge.verifier_reads(ctx), revision=self.judge.step.verify_revision
            )
            self.ledger.with_settled_row(key, lambda: None, reseal=True, seal=seal)
        return tuple(written)

    def _reverify_victim(self, key: StepKey, before: Checkpoint, after: Checkpoint) -> None:
        """Re-verify what is on disk now; roll back to the version read if it does not hold."""
        victim = self.judge.for_step(after.step_id)
        reloaded = self.checkpoints.load(after.key)
        report = victim.verify(victim.context(after.key), reloaded) if reloaded else None
        if report is not None and report.is_complete:
            return
        restore = self.checkpoints.stage(before)
        try:
            self.ledger.with_settled_row(
                after.key,
                restore.commit,
                reseal=True,
                seal=None,
                pointer=restore.pointer,
                reason="restored",
            )
        finally:
            restore.discard()
        raise PipelineError(
            ErrorCode.STEP_MUTATION_REJECTED,
            f"{key}: {after.key} failed re-verification after the edit; rolled back",
        )

    def settlement(self, key: StepKey, ctx_for: Callable[[], StepContext]) -> Settlement | None:
        """Edits written ahead but not all applied, that can be applied as they are (no
        review, no provider call): those of the published mutator checkpoint (the process
        died while settling), else those of the checkpoint written ahead with them (it died
        before publishing). None when neither holds (no intents, a victim changed since, a
        config change, it no longer verifies): the mutator reviews again.
        ``ctx_for`` builds the run's context once the intents allow a settlement."""
        existing, broken = self.judge.load_checkpoint(key)
        if existing is not None and broken is None and existing.status == StepStatus.COMPLETED:
            found = self._settleable(key, existing, ctx_for, written_ahead=False)
            if found is not None:
                return found
        ahead = self.checkpoints.load_pending(key, key.step_id)
        if ahead is None or ahead.key != key or ahead.status != StepStatus.COMPLETED:
            return None
        if existing is not None and ahead.content_hash == existing.content_hash:
            return None  # the published one, judged above
        # What a review now would be judged against: the same contract and scoped config
        # (the victims, its only inputs, are compared by the intents).
        config = self.judge.scoped_config(self.judge.project(key))
        if (ahead.schema_version, ahead.config_hash) != (
            self.judge.step.schema_version,
            config.hash,
        ):
            return None
        return self._settleable(key, ahead, ctx_for, written_ahead=True)

    def _settleable(
        self,
        key: StepKey,
        checkpoint: Checkpoint,
        ctx_for: Callable[[], StepContext],
        *,
        written_ahead: bool,
    ) -> Settlement | None:
        source = str(self.checkpoints.path_for(key))
        try:
            intents = intents_of(checkpoint, source=source)
        except PipelineError:
            if written_ahead:
                return None  # a malformed copy offers nothing: review again
            raise
        for intent in intents:
            victim_key = StepKey(key.project_id, key.episode_id, intent.victim)
            current, _ = self.judge.load_checkpoint(victim_key)
            found = current.content_hash if current is not None else None
            pending = self.checkpoints.load_pending(key, intent.victim)
            ready = pending is not None and pending.content_hash == intent.result
            if found != intent.result and not (found == intent.base and ready):
                return None
        if not intents:
            return None
        ctx = ctx_for()
        report = self.judge.verify(ctx, checkpoint)
        if not report.is_complete:
            return None
        return Settlement(checkpoint, tuple(intents), report, ctx, written_ahead=written_ahead)
