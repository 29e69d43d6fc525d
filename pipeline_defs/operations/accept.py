"""Keep a hand edit: make an operator's edit of a checkpoint the new truth (``storyboard
accept``), instead of the only other answer, a force that throws the edit away.

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
"""

import json
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.files import read_nofollow
from pipeline_defs.resume.partition import Episode
from pipeline_defs.resume.status import SETTLED_RESULT, StepStatus
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.store import ARCHIVE_DIR

MANUAL = "manual"


@dataclass(frozen=True)
class AcceptReport:
    """What ``storyboard accept`` did."""

    partition: str
    step: str
    accepted: bool
    changed: list[str] = field(default_factory=list)  # data paths the step re-derived
    content_hash: str | None = None
    archived: str | None = None
    downstream: list[str] = field(default_factory=list)  # they judge themselves next
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _refused(key: object, problem: str, exc: PipelineError | None = None) -> PipelineError:
    return PipelineError(
        ErrorCode.ACCEPT_REFUSED,
        f"{key}: the hand edit cannot be accepted: {problem}; nothing was changed "
        "(fix the edit, or `storyboard force` to rebuild the step)",
        origin=exc.origin if exc is not None else None,
        details=exc.details if exc is not None else None,
    )


def _paths(before: Any, after: Any, where: str = "data") -> list[str]:
    """Dotted paths where ``after`` differs from ``before`` (lists by index)."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        out: list[str] = []
        for name in sorted(set(before) | set(after), key=str):
            out += _paths(before.get(name), after.get(name), f"{where}.{name}")
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for index, (b, a) in enumerate(zip(before, after, strict=True)):
            out += _paths(b, a, f"{where}[{index}]")
        return out
    return [] if before == after else [where]


def accept(
    ws: Workspace, episode: Episode, step_id: str, *, launch_path: str = "cli"
) -> AcceptReport:
    """Validate, re-derive, verify and publish the hand-edited checkpoint of one step."""
    step = ws.step(step_id)
    key = episode.step(step_id)
    judge = ws.judge(step)
    checkpoints = ws.checkpoints
    checkpoints.refuse_links_in_tree(key)  # nothing read or written through a link
    row = ws.ledger.get(key)
    if row is None or row.status not in SETTLED_RESULT:
        status = "absent" if row is None else str(row.status)
        raise PipelineError(
            ErrorCode.ACCEPT_NOTHING,
            f"{key}: its ledger row is {status}: only a published (completed or partial) "
            "checkpoint can take a hand edit",
        )
    path = checkpoints.path_for(key)
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
        return AcceptReport(
            episode.partition_key, step_id, False, note="the checkpoint was not edited"
        )
    derived = dict(step.accept_edit(edited.data))
    changed = _paths(edited.data, derived) or ["data (fields the step does not derive)"]
    now = format_timestamp(datetime.now(UTC))
    run_id = f"accept:{uuid.uuid4().hex[:12]}"
    record = {"by_step": MANUAL, "run_id": run_id, "at": now, "fields": changed, "origin": MANUAL}
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
        seal = (
            checkpoints.seal(
                new, judge.verifier_reads(ctx), file=staged.temp, revision=step.verify_revision
            )
            if row.status == StepStatus.COMPLETED
            else None
        )
        ws.ledger.with_settled_row(
            key, staged.commit, reseal=True, seal=seal, pointer=staged.pointer, reason="accepted"
        )
    finally:
        staged.discard()
    ws.ledger.append_transition(
        key,
        action="accepted",
        from_status=str(row.status),
        to_status=str(row.status),
        origin=MANUAL,
        reason=f"hand edit accepted: {', '.join(changed)[:900]}",
        run_id=run_id,
        launch_path=launch_path,
    )
    archived = sorted((checkpoints.step_dir(key) / ARCHIVE_DIR).glob("*-replaced.json"))
    return AcceptReport(
        episode.partition_key,
        step_id,
        True,
        changed=changed,
        content_hash=new.content_hash,
        archived=str(archived[-1]) if archived else None,
        downstream=[k.step_id for k in judge.downstream_keys(key)],
    )
