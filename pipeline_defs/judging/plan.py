"""What a tick must judge: the plan phase's decisions, from the cursor and the memos.

A partition is re-judged when its scan differs from its memo (``disk``), it has no memo
(``new``), its wake time has come (``time``), or the judged fields of its ledger rows
differ from what its memo saw (``ledger``). Everything is judged (``full``) every
``full_refresh_seconds``, when the ledger cursor went backwards or the clock did, and when
there is no usable memory (``cold``).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline_defs.judging.cursor import CursorState
from pipeline_defs.judging.memo import Memo, group_rows, row_fingerprint
from pipeline_defs.judging.scan import PartitionScan, Scan
from pipeline_defs.resume.partition import StepKey


@dataclass
class TickPlan:
    """The plan phase's answer: what to judge (``chosen``) and with which rows and scans."""

    mode: str  # unchanged | incremental | full | cold
    keys: list[str]
    epoch: float
    parts: str
    marker: tuple[int, str]
    shape: PartitionScan
    scanned: Mapping[str, Scan]
    tree: str
    memory_ok: bool
    full_at: float
    rows: Mapping[StepKey, Mapping[str, Any]] = field(default_factory=dict)
    chosen: list[str] = field(default_factory=list)


def full_due(
    state: CursorState | None, marker: tuple[int, str], epoch: float, refresh: float
) -> bool:
    """Whether everything is judged this tick (no cursor, refresh due, time or ledger back)."""
    previous = state.ledger if state is not None else None
    last_full = state.full_at if state is not None else None
    return (
        state is None
        or previous is None
        or last_full is None
        or epoch - last_full >= refresh
        or marker < previous
        or epoch < last_full  # clock went backwards
    )


def unchanged(
    state: CursorState | None, marker: tuple[int, str], parts: str, tree: str, epoch: float
) -> bool:
    """Nothing moved since ``state``: same ledger, partitions and tree, no wake due."""
    return (
        state is not None
        and state.ledger == marker
        and state.parts == parts
        and state.tree == tree
        and (state.wake is None or epoch < state.wake)
        and not state.pending
    )


def changed_partitions(
    keys: Sequence[str], scanned: Mapping[str, Scan], memos: Mapping[str, Memo], epoch: float
) -> dict[str, str]:
    """Partition → why it is re-judged, from the scan and the clock (``new``/``disk``/``time``)."""
    targets: dict[str, str] = {}
    for pk in keys:
        memo = memos.get(pk)
        if memo is None:
            targets[pk] = "new"
        elif memo.tree != scanned[pk].ints:
            targets[pk] = "disk"
        elif memo.wake is not None and epoch >= memo.wake:
            targets[pk] = "time"
    return targets


def add_ledger_changes(
    targets: dict[str, str],
    keys: Sequence[str],
    rows: Mapping[StepKey, Mapping[str, Any]],
    memos: Mapping[str, Memo],
) -> None:
    """Add (as ``ledger``) the partitions whose rows' judged fields differ from their memo."""
    by_partition = group_rows(rows)
    for pk in keys:
        if pk not in targets and pk in by_partition:
            memo = memos.get(pk)
            if memo is None or memo.rows != row_fingerprint(by_partition[pk]):
                targets[pk] = "ledger"
