"""What a tick must judge, and which of its launches wait: the plan phase's decisions.

A partition is re-judged when its scan differs from its memo (``disk``), it has no memo
(``new``), its wake time has come (``time``), the judged fields of its ledger rows differ
from what its memo saw (``ledger``), or a run that held its launches back has ended
(``run``), or a backfill that did (``backfill``). Everything is judged (``full``) every
``full_refresh_seconds``, when the ledger cursor went backwards or the clock did, and when
there is no usable memory (``cold``).

After judging, :func:`hold_for_backfills` keeps a partition's run from being requested
while a backfill in progress targets it, and :func:`hold_back` while another run of that
partition is in flight (docs/DESIGN.md#sensor).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeline_defs.judging.cursor import CursorState
from pipeline_defs.judging.evaluation import rows_by_partition
from pipeline_defs.judging.memo import Memo, group_rows, row_fingerprint
from pipeline_defs.judging.scan import PartitionScan, Scan
from pipeline_defs.judging.step_evaluation import StepEvaluation
from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow


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
    rows: Mapping[StepKey, LedgerRow] = field(default_factory=dict)
    chosen: list[str] = field(default_factory=list)
    # Partitions due (never judged, or not yet reached by a refresh) that this tick leaves
    # to the next ones (budget): pending in the cursor, so the next tick is not idle.
    deferred: list[str] = field(default_factory=list)
    # The partitions asked to be judged again (``ResumeTicker.recheck``) that this plan took.
    rechecked: frozenset[str] = frozenset()
    _grouped: tuple[object, dict[str, dict[str, tuple[StepKey, LedgerRow]]]] | None = None

    def by_partition(self) -> dict[str, dict[str, tuple[StepKey, LedgerRow]]]:
        """``rows`` by partition, then step id (grouped once: the judge and the memos both
        read them per partition)."""
        if self._grouped is None or self._grouped[0] is not self.rows:
            self._grouped = (self.rows, rows_by_partition(self.rows))
        return self._grouped[1]


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
    rows: Mapping[StepKey, LedgerRow],
    memos: Mapping[str, Memo],
) -> None:
    """Add (as ``ledger``) the partitions whose rows' judged fields differ from their memo."""
    by_partition = group_rows(rows)
    for pk in keys:
        if pk not in targets and pk in by_partition:
            memo = memos.get(pk)
            if memo is None or memo.rows != row_fingerprint(by_partition[pk]):
                targets[pk] = "ledger"


def hold_for_backfills(
    launches: Sequence[StepEvaluation], backfills: Mapping[str, str]
) -> tuple[list[StepEvaluation], dict[str, str]]:
    """(the launches to request now, the partitions held → the backfill that targets them).

    ``backfills``: partition → a backfill in progress that targets it (Dagster's view). The
    backfill launches that partition's run itself, when its daemon gets to it; a run of the
    sensor's before then would take the work and leave the backfill's run to wait in the
    queue and skip every step. So nothing of the partition is requested (a stale-lease
    recovery neither: the backfill's run judges the row and recovers it) until the backfill
    has ended; the tick after that judges it again (``backfill``) and requests what is left.
    """
    if not backfills:
        return list(launches), {}
    kept = [ev for ev in launches if ev.partition_key not in backfills]
    held = {ev.partition_key for ev in launches if ev.partition_key in backfills}
    return kept, {pk: backfills[pk] for pk in sorted(held)}


def hold_back(
    launches: Sequence[StepEvaluation],
    in_flight: Mapping[str, float | None],
    rows: Mapping[StepKey, LedgerRow],
    epoch: float,
    lease_seconds: float,
) -> tuple[list[StepEvaluation], dict[str, float | None]]:
    """(the launches to request now, the partitions held back → when to look again).

    ``in_flight``: partition → a run of its steps that has not ended, as Dagster sees it:
    its last sign of life (when it started), or None while it waits in the queue. Such a
    run has steps it has not reached yet; judged now they look like work (a first run has
    no row yet), and a second run of them would race the first one's claims. So the
    partition waits: the tick that sees the run ended judges it again (``run``) and
    requests what is left.

    Two escapes keep a dead run from holding a partition for ever, both the lease's rule
    (docs/DESIGN.md#leases): a stale-lease recovery is never held (the lapsed lease is the
    evidence), and a started run that has left no trace in the partition's rows (claim,
    heartbeat, publish) for ``lease_seconds`` is taken for dead; the held partition wakes
    then to look again.
    """
    if not in_flight:  # nothing held (and no need to group every row of a cold tick)
        return list(launches), {}
    by_pk: dict[str, list[StepEvaluation]] = {}
    for ev in launches:
        by_pk.setdefault(ev.partition_key, []).append(ev)
    grouped = group_rows(rows)
    kept: list[StepEvaluation] = []
    held: dict[str, float | None] = {}
    for pk, evs in by_pk.items():
        if pk not in in_flight or any(
            ev.decision.action is ResumeAction.STALE_RUNNING_RECOVERY for ev in evs
        ):
            kept.extend(evs)
            continue
        started = in_flight[pk]
        if started is None:  # queued: the queue starts it, and its end releases the partition
            held[pk] = None
            continue
        seen = max([started, *(_last_trace(row) for row in grouped.get(pk, ()))])
        if epoch - seen >= lease_seconds:
            kept.extend(evs)  # no trace for a whole lease: taken for dead
        else:
            held[pk] = seen + lease_seconds
    return kept, held


def _last_trace(row: LedgerRow) -> float:
    """The latest moment a run left in a ledger row (update, heartbeat), as epoch seconds."""
    moments = [parse_timestamp(row.updated_at), parse_timestamp(row.heartbeat_at)]
    return max((m.timestamp() for m in moments if m is not None), default=0.0)
