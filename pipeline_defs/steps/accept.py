"""Keep a hand edit: make an operator's edit of a checkpoint the new truth, instead of the
only other answer, a force that throws the edit away (docs/DESIGN.md#hand-edits).

The edited ``checkpoint.json`` fails its own content hash (that is how an edit is seen, and
why the judge blocks it). Accepting it: the step recomputes what it derives from the edited
data (``Step.accept_edit``: the sentinel hash of an edited prompt), the step's own
``validate_data`` and verifier judge the result, and only a clean result is published,
exactly as a mutator's edit is: the file on disk is archived, the new envelope (content hash
recomputed, a ``manual`` entry in ``mutations``) is written under the row lock of a settled
row, sealed, and audited with origin ``manual`` and what changed. No model call. An edit the
step cannot make valid is refused with a typed error naming the field, and nothing changes.
Downstream steps then judge themselves against the new upstream (self-only, as after the
review): nothing is invalidated.

Dagster-free and below the asset factory, so that both ways of asking share this one core:
``storyboard accept`` (``pipeline_defs/operations/accept_command.py``) and a launch tagged
``resume/mode=accept`` (``pipeline_defs/wiring/assets.py``, docs/DESIGN.md#launch-paths).
"""

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.files import read_nofollow
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import SETTLED_RESULT, StepStatus
from pipeline_defs.steps.judge import StepJudge
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.store import CheckpointStore
from resources.ledger.audit import Audit, AuditAction
from resources.ledger.store import LedgerStore

MANUAL = "manual"  # the origin (audit) and ``by_step`` (mutations) of an accepted edit
ACCEPTED = AuditAction.ACCEPTED.value  # the decision a tagged run's metadata names (text)


@dataclass(frozen=True)
class Accepted:
    """What accepting one step's hand edit did, or (``accepted`` False) why it did nothing."""

    key: StepKey
    accepted: bool
    note: str = ""
    checkpoint: Checkpoint | None = None  # the envelope now published
    status: str | None = None  # the row's status, kept as it was (completed or partial)
    changed: tuple[str, ...] = ()  # data paths the editor changed (the hashed fields)
    derived: tuple[str, ...] = ()  # data paths the step re-derived from them
    archived: str | None = None  # the edited file as it was, kept as evidence
    downstream: tuple[str, ...] = ()  # steps that judge themselves against it next
    run_id: str | None = None  # names the accept in the audit row and in ``mutations``


def _refused(key: object, problem: str, exc: PipelineError | None = None) -> PipelineError:
    return PipelineError(
        ErrorCode.ACCEPT_REFUSED,
        f"{key}: the hand edit cannot be accepted: {problem}; nothing was changed "
        "(fix the edit, or `storyboard force` to rebuild the step)",
        origin=exc.origin if exc is not None else None,
        details=exc.details if exc is not None else None,
    )


def edited_fields(derived: Sequence[str]) -> list[str]:
    """The fields an editor changed, from the hashes the step re-derived for them: a hash
    names its field by its own name (``t2i_prompt_hash`` covers ``t2i_prompt``), beside it
    or, in an ``owned_validation`` sentinel, beside the sentinel. A path of another shape is
    its own field."""
    out: list[str] = []
    for path in derived:
        parent, _, name = path.rpartition(".")
        if not parent or not name.endswith("_hash"):
            out.append(path)
            continue
        parent = parent.removesuffix(".owned_validation")
        field = f"{parent}.{name.removesuffix('_hash')}"
        if field not in out:
            out.append(field)
    return out


def changed_paths(before: Any, after: Any, where: str = "data") -> list[str]:
    """Dotted paths where ``after`` differs from ``before`` (lists by index)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        out: list[str] = []
        for name in sorted(set(before) | set(after), key=str):
            out += changed_paths(before.get(name), after.get(name), f"{where}.{name}")
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for index, (b, a) in enumerate(zip(before, after, strict=True)):
            out += changed_paths(b, a, f"{where}[{index}]")
        return out
    return [] if before == after else [where]


def hand_edited(checkpoints: CheckpointStore, key: StepKey) -> bool:
    """Whether ``key``'s checkpoint file carries an edit made by hand: its stored content
    hash is not the one its content gives, or it no longer parses as an envelope.

    How a ``resume/mode=accept`` launch picks the steps it accepts (docs/DESIGN.md#hand-edits).
    An unparseable file counts as an edit: accepting it is then refused naming the problem,
    which says more to the operator who asked for an accept than a block would. Anything
    else (no file, a link, not a file) is no edit: the step's own judge reports it.
    """
    path = checkpoints.path_for(key)
    try:
        checkpoints.checkout_edit(key)  # on object storage: the envelope object as it is now
        raw = json.loads(read_nofollow(path).decode("utf-8"))
    except (OSError, PipelineError):
        return False
    except ValueError:  # not UTF-8 or not JSON (UnicodeDecodeError is a ValueError)
        return True
    try:
        found = Checkpoint.from_dict(raw, source=str(path), edited=True)
    except PipelineError:
        return True
    return bool(raw.get("content_hash") != found.content_hash)


def accept_hand_edit(
    judge: StepJudge,
    key: StepKey,
    *,
    ledger: LedgerStore,
    checkpoints: CheckpointStore,
    run_id: str | None = None,
    launch_path: str = "cli",
    now: datetime | None = None,
) -> Accepted:
    """Validate, re-derive, verify and publish the hand-edited checkpoint of ``judge``'s step.

    ``run_id`` names the accept in the audit row and the envelope's ``mutations`` (a tagged
    Dagster run passes its owner token; the CLI gets a fresh ``accept:<hex>``). Raises
    ``accept.nothing_published`` when there is no published checkpoint to edit and
    ``accept.refused`` when the edit cannot be made valid, in both cases changing nothing;
    an unedited checkpoint is no error here (``accepted`` False): the caller decides.

    ``judge`` reads and verifies (its readers, by type); ``ledger`` and ``checkpoints`` are
    the full stores the accept writes through (the ones the judge reads).
    """
    step = judge.step
    checkpoints.refuse_links_in_tree(key)  # nothing read or written through a link
    row = ledger.get(key)
    if row is None or row.status not in SETTLED_RESULT:
        status = "absent" if row is None else str(row.status)
        raise PipelineError(
            ErrorCode.ACCEPT_NOTHING,
            f"{key}: its ledger row is {status}: only a published (completed or partial) "
            "checkpoint can take a hand edit",
        )
    path = checkpoints.path_for(key)
    checkpoints.checkout_edit(key)  # on object storage: the envelope object as it is now
    try:
        raw = json.loads(read_nofollow(path).decode("utf-8"))
    except FileNotFoundError:
        raise PipelineError(
            ErrorCode.ACCEPT_NOTHING, f"{key}: there is no checkpoint file at {path}"
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise _refused(key, f"{path} is not valid JSON ({exc})") from None
    try:
        edited = Checkpoint.from_dict(raw, source=str(path), edited=True)
    except PipelineError as exc:  # a field of the wrong shape: named by the envelope check
        raise _refused(key, exc.message, exc) from None
    if edited.key != key:
        raise _refused(key, f"{path} names {edited.key}, not {key}")
    if raw.get("content_hash") == edited.content_hash:
        return Accepted(key, False, note="the checkpoint was not edited")
    derived = dict(step.accept_edit(edited.data))
    rederived = changed_paths(edited.data, derived)
    changed = edited_fields(rederived) or ["data (fields the step does not derive)"]
    stamp = format_timestamp(now or datetime.now(UTC))
    run_id = run_id or f"accept:{uuid.uuid4().hex[:12]}"
    record = {"by_step": MANUAL, "run_id": run_id, "at": stamp, "fields": changed, "origin": MANUAL}
    new = edited.with_changes(data=derived, mutations=(*edited.mutations, record))
    try:
        step.validate_data(new.data, source=str(path))
    except PipelineError as exc:
        raise _refused(key, exc.message, exc) from None
    ctx = judge.context(key)
    report = judge.verify(ctx, new)
    if not report.is_complete:
        listed = "; ".join(list(report.missing)[:3])
        raise PipelineError(
            ErrorCode.ACCEPT_REFUSED,
            f"{key}: the hand edit cannot be accepted: the step's verifier finds "
            f"{report.origin.value if report.origin else 'a problem'}: {listed}; nothing was "
            "changed (fix the edit, or `storyboard force` to rebuild the step)",
            origin=report.origin.value if report.origin else None,
        )
    staged = checkpoints.stage(new)  # archives the edited file as it was (evidence)
    try:
        # A partial row never keeps a seal (docs/DESIGN.md#seals): only a completed one is
        # re-sealed, in the same transaction as the commit.
        seal = (
            checkpoints.seal(
                new, judge.verifier_reads(ctx), file=staged.temp, revision=step.verify_revision
            )
            if row.status == StepStatus.COMPLETED
            else None
        )
        # The accepted edit and its history line commit together (docs/DESIGN.md#audit).
        ledger.with_settled_row(
            key,
            staged.commit,
            reseal=True,
            seal=seal,
            pointer=staged.pointer,
            reason=ACCEPTED,
            audit=Audit(
                AuditAction.ACCEPTED,
                from_status=None,  # the row's own status, filled in under its lock
                to_status=None,
                origin=MANUAL,
                reason=f"hand edit accepted: {', '.join(changed)[:900]}",
                run_id=run_id,
                launch_path=launch_path,
            ),
        )
    finally:
        staged.discard()
    archived = sorted(checkpoints.archive_dir(key).glob("*-replaced.json"))
    return Accepted(
        key,
        True,
        checkpoint=new,
        status=str(row.status),
        changed=tuple(changed),
        derived=tuple(rederived),
        archived=str(archived[-1]) if archived else None,
        downstream=tuple(k.step_id for k in judge.downstream_keys(key)),
        run_id=run_id,
    )
