"""Applying a mutator's edits to its victims (docs/DESIGN.md#review): each edit built on the
victim the mutator read and verified by the victim's own judge, then settled as one
compare-and-set under the victim's row lock, re-verified on disk, rolled back if it does
not hold.

Each settled edit is one unit of work in the ledger (``LedgerStore.with_settled_row``): the
compare-and-set, the victim's new seal and pointer, the rename of the edited checkpoint and
its ``mutated`` history line commit together or not at all. An edit the ledger refuses (the
victim is running, has no settled result, or is no longer the version the mutator read)
leaves an ``edit_refused`` line, written in the transaction that found it out, and nothing
else (docs/DESIGN.md#audit). The intents and their write-ahead are
:mod:`pipeline_defs.steps.mutations`.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.faults import crash_point
from pipeline_defs.steps.mutations import (
    Intent,
    PreparedEdit,
    Settlement,
    Verifier,
    find_settlement,
    held_intents,
)
from pipeline_defs.steps.spec import Mutation
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.store import CheckpointStore
from resources.ledger.audit import Audit, AuditAction
from resources.ledger.store import LedgerStore

VICTIM_CHANGED = ErrorCode.MUTATION_VICTIM_CHANGED


class MutatorEdits:
    """The run protocol's side of one mutator's edits (steps 1 and 4 of
    :mod:`pipeline_defs.steps.mutations`, and resuming a cut-short settle), for a run that
    holds the mutator's claim. Victims are verified by their own judges (``judge.for_step``)."""

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

    # ------------------------------------------------------------------------- prepare
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

    # -------------------------------------------------------------------------- settle
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
        """Bring every victim to its intended version (each edit with its history line);
        ``reseal`` the mutator's published row (its seal names the victims' files).
        Returns the victims written.

        Raises ``mutation.victim_changed`` (nothing written for that victim, an
        ``edit_refused`` line recorded) when a victim is neither at its base nor at its
        result, or when its write-ahead edit is missing.
        """
        line = Audit(AuditAction.MUTATED, None, None, run_id=run_id, launch_path=launch_path)
        written: list[str] = []
        for intent in intents:
            if self._apply(key, intent, line):
                written.append(intent.victim)
                crash_point("mutation.victim_written", key.step_id)
        if reseal and written:
            # The mutator's seal covers its victims' files: renew it now they hold the edits.
            self.ledger.with_settled_row(
                key, lambda: None, reseal=True, seal=self._reseal(key, checkpoint, ctx)
            )
        return tuple(written)

    def _apply(self, mutator: StepKey, intent: Intent, line: Audit) -> bool:
        """One victim brought to ``intent.result``; False when it already was."""
        victim_key = StepKey(mutator.project_id, mutator.episode_id, intent.victim)
        current = self.checkpoints.load(victim_key)
        found = current.content_hash if current is not None else None
        if found == intent.result:
            self.checkpoints.drop_pending(mutator, intent.victim)
            return False
        refused = replace(
            line, action=AuditAction.EDIT_REFUSED, reason=f"edit by {mutator.step_id} refused"
        )
        pending = self.checkpoints.load_pending(mutator, intent.victim)
        if (
            current is None
            or found != intent.base
            or pending is None
            or pending.content_hash != intent.result
        ):
            changed = _victim_changed(
                f"{mutator}: {victim_key} is no longer the checkpoint {mutator.step_id} read "
                f"(expected {intent.base[:12]}, found {str(found)[:12]}); nothing written"
            )

            def refuse() -> None:
                raise changed

            # Nothing to apply: the refusal is recorded under the row lock, and raised.
            self.ledger.with_settled_row(victim_key, lambda: None, check=refuse, refused=refused)
            raise changed  # pragma: no cover - with_settled_row raised it
        fields = list(pending.mutations[-1].get("fields", [])) if pending.mutations else []
        note = pending.mutations[-1].get("origin") if pending.mutations else None
        mutated = replace(line, reason=f"{note or 'edited'} by {mutator.step_id}: fields {fields}")

        def unchanged(base: str = intent.base) -> None:
            # Under the victim's row lock: apply only to the version the mutator read.
            now = self.checkpoints.load(victim_key)
            if now is None or now.content_hash != base:
                raise _victim_changed(
                    f"{mutator}: {victim_key} changed while its edit was being applied; "
                    "nothing written"
                )

        staged = self.checkpoints.stage(pending)  # archives the victim first
        try:
            self.ledger.with_settled_row(
                victim_key,
                staged.commit,
                check=unchanged,
                reseal=True,
                seal=self._seal(pending, staged.temp),
                pointer=staged.pointer,
                audit=mutated,
                refused=refused,
            )
        finally:
            staged.discard()
        self.checkpoints.drop_pending(mutator, intent.victim)
        self._reverify_victim(mutator, current, pending, line)
        return True

    def _reseal(self, key: StepKey, published: Checkpoint, ctx: StepContext) -> str | None:
        """The mutator's seal over its victims' edited files, or None (then left unsealed).

        The store seals only the very file a checkpoint was loaded from; the object this run
        published was written, not loaded, so the seal is taken from the file as it is read
        back now, and only while it is still the version this run published (a demo run
        left every review row unsealed, judged the long way by every sensor refresh)."""
        try:
            current = self.checkpoints.load(key)
        except PipelineError:
            return None  # unreadable or replaced by a link: unsealed, the long way reports it
        if current is None or (current.version, current.content_hash) != (
            published.version,
            published.content_hash,
        ):
            return None
        return self.checkpoints.seal(
            current, self.judge.verifier_reads(ctx), revision=self.judge.step.verify_revision
        )

    def _seal(self, edited: Checkpoint, temp: Path) -> str | None:
        """The edit was verified clean: sealed like a publish (the old seal named the
        replaced file)."""
        victim = self.judge.for_step(edited.step_id)
        return self.checkpoints.seal(
            edited,
            victim.verifier_reads(victim.context(edited.key)),
            file=temp,
            revision=victim.step.verify_revision,
        )

    def _reverify_victim(
        self, key: StepKey, before: Checkpoint, after: Checkpoint, line: Audit
    ) -> None:
        """Re-verify what is on disk now; roll back to the version read if it does not hold
        (the roll-back is an edit too, recorded with it)."""
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
                audit=replace(
                    line,
                    reason=f"edit by {key.step_id} rolled back: it failed re-verification",
                ),
            )
        finally:
            restore.discard()
        raise PipelineError(
            ErrorCode.STEP_MUTATION_REJECTED,
            f"{key}: {after.key} failed re-verification after the edit; rolled back",
        )

    def settlement(self, key: StepKey, ctx_for: Callable[[], StepContext]) -> Settlement | None:
        """Written-ahead edits a re-run can apply as they are (``mutations.find_settlement``)."""
        return find_settlement(self.judge, self.checkpoints, key, ctx_for)


def _victim_changed(message: str) -> PipelineError:
    return PipelineError(VICTIM_CHANGED, message, status=409, origin=Origin.ARTIFACT_MISSING.value)
