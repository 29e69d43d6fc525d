"""What a tick remembers of each partition it judged, so the next tick can skip it.

A memo holds what a partition's last judgement was made from (a fingerprint of its
ledger rows, its scan, the input files seen) and what came of it (the run keys launched,
the earliest moment time alone changes a decision, verdict counts). The memos live in
process memory (the sensor's code server is long-lived) and are tied to the persisted
cursor by a token.
"""

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from pipeline_defs.judging.scan import Scan
from pipeline_defs.judging.step_evaluation import JUDGED_COLUMNS, StepEvaluation, Verdict
from pipeline_defs.judging.wake import next_wake
from pipeline_defs.resume.identity import Identity
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow


@dataclass
class Memo:
    """What the last judgement of one partition was made from."""

    rows: int
    tree: tuple[int, ...]
    inputs: tuple[str, ...]
    input_dir: Identity
    wake: float | None
    launched: frozenset[str]
    counts: tuple[int, int, int, int]  # blocked, waiting, deferred, running (a live lease)


class Judged(Protocol):
    """What :func:`memoise` reads of a tick's plan (``plan.TickPlan``)."""

    @property
    def keys(self) -> list[str]: ...

    @property
    def chosen(self) -> list[str]: ...

    @property
    def rows(self) -> Mapping[StepKey, LedgerRow]: ...

    @property
    def scanned(self) -> Mapping[str, Scan]: ...

    def by_partition(self) -> Mapping[str, Mapping[str, tuple[StepKey, LedgerRow]]]: ...


def memoise(
    plan: Judged,
    evaluations: Sequence[StepEvaluation],
    judged: Sequence[str],
    memos: Mapping[str, Memo],
    settings: ResumeSettings,
    now: datetime,
) -> tuple[list[StepEvaluation], dict[str, Memo]]:
    """(fresh launches, the memos of every partition after this tick).

    A partition not chosen, or chosen and left over (budget), keeps the memo it had (a
    never-judged one has none yet). Each run key is launched once per process (Dagster
    dedupes run keys anyway).
    """
    by_pk: dict[str, list[StepEvaluation]] = {}
    for ev in evaluations:
        by_pk.setdefault(ev.partition_key, []).append(ev)
    grouped_rows = plan.by_partition()
    launches: list[StepEvaluation] = []
    new_memos: dict[str, Memo] = {}
    chosen_set, judged_set = set(plan.chosen), set(judged)
    for pk in plan.keys:
        if pk not in chosen_set:
            kept = memos.get(pk)
            if kept is not None:  # none: never judged yet, left for later (deferred)
                new_memos[pk] = kept
            continue
        if pk not in judged_set:
            # Over budget: the next ticks judge it (ResumeTicker._unfinished). A memo it had
            # is kept: what it saw still tells a change from none, and a run key it launched
            # is not launched again.
            kept = memos.get(pk)
            if kept is not None:
                new_memos[pk] = kept
            continue
        evs = by_pk.get(pk, [])  # workers leave out SKIPs
        previous_memo = memos.get(pk)
        already = previous_memo.launched if previous_memo else frozenset()
        launches.extend(ev for ev in evs if ev.launch and ev.run_key not in already)
        found = grouped_rows.get(pk)
        pk_rows = [row for _key, row in found.values()] if found is not None else []
        wake_at = next_wake(pk_rows, settings, now)
        scan = plan.scanned[pk]
        new_memos[pk] = Memo(
            rows=row_fingerprint(pk_rows),
            tree=scan.ints,
            inputs=scan.inputs,
            input_dir=scan.input_dir,
            wake=wake_at.timestamp() if wake_at else None,
            launched=frozenset(ev.run_key for ev in evs if ev.launch and ev.run_key),
            counts=(
                sum(ev.verdict is Verdict.BLOCKED and not ev.running_healthy for ev in evs),
                sum(ev.verdict is Verdict.WAITING for ev in evs),
                sum(ev.verdict is Verdict.DEFERRED for ev in evs),
                sum(ev.running_healthy for ev in evs),
            ),
        )
    return launches, new_memos


def group_rows(
    rows: Mapping[StepKey, LedgerRow],
) -> dict[str, list[LedgerRow]]:
    """The rows by partition key."""
    grouped: dict[str, list[LedgerRow]] = {}
    for key, row in rows.items():
        grouped.setdefault(key.partition_key, []).append(row)
    return grouped


def row_fingerprint(rows: Iterable[LedgerRow]) -> int:
    """The judged fields of a partition's rows, as one hash."""
    # Attributes, not the rows' mapping view: this runs for every row of a cold tick, and
    # the view's ``get`` (through ``Mapping``) made this fingerprint 3x slower (0.12 s →
    # 0.34 s for 20,000 rows, profiled with benchmarks/sensor_tick.py --sizes 2000).
    return hash(tuple(sorted(map(_JUDGED_FIELDS, rows))))


_JUDGED_FIELDS = operator.attrgetter("step_id", *JUDGED_COLUMNS)
