"""``storyboard accept``: keep an operator's hand edit of a checkpoint (the CLI side).

What an accept does, and why, is ``pipeline_defs/steps/accept.py`` (the one core, shared
with the run tag ``resume/mode=accept``); this module finds the step and reports.
"""

from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.partition import Episode
from pipeline_defs.steps.accept import MANUAL, accept_hand_edit

# MANUAL stays importable from here, where it was defined before the core moved down.
__all__ = ["MANUAL", "AcceptReport", "accept"]


@dataclass(frozen=True)
class AcceptReport:
    """What ``storyboard accept`` did."""

    partition: str
    step: str
    accepted: bool
    changed: list[str] = field(default_factory=list)  # data paths the editor changed
    derived: list[str] = field(default_factory=list)  # data paths the step re-derived
    content_hash: str | None = None
    archived: str | None = None
    downstream: list[str] = field(default_factory=list)  # they judge themselves next
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def accept(
    ws: Workspace, episode: Episode, step_id: str, *, launch_path: str = "cli"
) -> AcceptReport:
    """Validate, re-derive, verify and publish the hand-edited checkpoint of one step.

    The work is ``pipeline_defs.steps.accept.accept_hand_edit``, shared with a launch tagged
    ``resume/mode=accept``; this is the operator's view of it. An unedited checkpoint is no
    error for the CLI: it says there was nothing to accept.
    """
    step = ws.step(step_id)
    done = accept_hand_edit(
        ws.judge(step),
        episode.step(step_id),
        ledger=ws.ledger,
        checkpoints=ws.checkpoints,
        launch_path=launch_path,
    )
    if not done.accepted:
        return AcceptReport(episode.partition_key, step_id, False, note=done.note)
    assert done.checkpoint is not None  # an accepted edit is always published
    return AcceptReport(
        episode.partition_key,
        step_id,
        True,
        changed=list(done.changed),
        derived=list(done.derived),
        content_hash=done.checkpoint.content_hash,
        archived=done.archived,
        downstream=list(done.downstream),
    )
