"""A mutator and its edits are one recoverable unit (SPEC §7, §11; issue 10 §1-§2).

A mutator (``Step.modifies_checkpoints``) edits other steps' checkpoints in place. Its run
used to publish its own checkpoint first and edit the victims afterwards: a process killed
in between left the mutator ``completed`` with its fixes never applied, and a later resume
skipped everything. Now:

1. **prepare** (no writes): each edit is built on the victim the mutator *read* (its content
   hash is the intent's ``base``), validated and verified; its content hash is ``result``.
   A victim the mutator left alone gets ``base == result``.
2. **write ahead**: every edit that changes something is written to the mutator's
   ``pending/<victim>.json``.
3. the mutator **publishes** its checkpoint, whose data carries the intents under
   ``INTENTS_KEY``. From here on the intents are the truth about what the review expects.
4. **settle**: each victim is a compare-and-set under its row lock: at ``base`` → the
   pending edit replaces it; at ``result`` → already applied; anything else →
   ``mutation.victim_changed`` and nothing written.

Judging (read-only, :func:`intent_report`): a mutator whose every victim is at its
``result`` is clean. A victim at ``base`` (the process died before settling) or at any
other version (rebuilt since the review) makes it incomplete (``artifact_missing``), so the
judge re-runs the mutator alone. That re-run first settles what the write-ahead edits
allow, with no provider call (each fix is applied exactly once); only when a victim
changed since the review does it review again.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline_defs.resume.completion import CompletionReport, Origin, Severity
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.faults import crash_point
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.store import CheckpointStore, StagedCheckpoint
from resources.ledger.store import LedgerStore

INTENTS_KEY = "mutation_intents"
VICTIM_CHANGED = "mutation.victim_changed"


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
            "checkpoint.invalid",
            f"{source}: field 'data.{INTENTS_KEY}' is malformed ({type(exc).__name__}: {exc})",
            origin=Origin.CONTRACT_DRIFT.value,
        ) from exc


def intent_report(
    checkpoints: CheckpointStore, mutator: StepKey, checkpoint: Checkpoint
) -> CompletionReport:
    """Whether every victim holds the version the published mutator left it at."""
    problems: list[str] = []
    source = str(checkpoints.path_for(mutator))
    for intent in intents_of(checkpoint, source=source):
        victim_key = StepKey(mutator.project_id, mutator.episode_id, intent.victim)
        try:
            current = checkpoints.load(victim_key)
        except PipelineError as exc:  # the victim's own judgement reports how it is broken
            problems.append(f"{intent.victim}: unreadable ({exc.code}); review again after it")
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
    checkpoints: CheckpointStore, mutator: StepKey, edits: Sequence[PreparedEdit]
) -> None:
    for edit in edits:
        if edit.intent.base != edit.intent.result:
            checkpoints.write_pending(mutator, edit.edited)
    crash_point("mutation.pending_written", mutator.step_id)


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

            ledger.with_settled_row(victim_key, compare_and_set, reseal=True, seal=seal)
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
