"""A tick's knobs (:class:`TickConfig`), its timing-free instrumentation
(:class:`TickStats`, the line the sensor logs) and its answer (:class:`TickResult`: the
cursor, the launches as runs, the block reports). Dagster-free.
"""

from dataclasses import dataclass, field

from pipeline_defs.judging.blocks import CheckChange
from pipeline_defs.judging.step_evaluation import Outage, StepEvaluation

_NAMED = 10  # partitions named per outage in the tick's line


@dataclass(frozen=True)
class TickConfig:
    """Knobs of the incremental tick."""

    full_refresh_seconds: float = 600.0
    skew_seconds: float = 300.0
    # More changed partitions than this (or than a quarter of all, if that is more): one
    # full row read instead of reading theirs.
    max_targeted: int = 2000
    workers: int | None = None  # judge processes; None = parallel.default_workers()
    parallel_from: int = 2000  # judge in workers from this many partitions on
    # Stop judging after this long; the rest is judged on the next ticks (Dagster gives a
    # sensor evaluation 60 s by default, a cold tick over many partitions can take longer).
    budget_seconds: float = 40.0
    # Judge a clean published checkpoint from its seal (stat calls) while its files are
    # unchanged; False reads and verifies every envelope on every full judgement.
    trust_seals: bool = True


@dataclass
class TickStats:
    """Timing-free instrumentation of one tick (logged by the sensor, read by tests)."""

    mode: str = "unchanged"  # unchanged | incremental | full | cold
    partitions: int = 0
    evaluated_partitions: int = 0
    judged: int = 0
    row_queries: int = 0
    rows_fetched: int = 0
    changed: dict[str, int] = field(default_factory=dict)  # why partitions were re-judged
    pending: int = 0  # changed partitions left for the next tick (over budget)
    unjudged: int = 0  # of those, never judged by this process yet (a cold start's rest)
    launches: int = 0  # steps launched
    runs: int = 0  # the runs they go in: at most one per partition
    held: int = 0  # partitions whose run waits for a run of theirs in flight, or a backfill
    # Of those, the ones a backfill in progress targets: partition → the backfill's id.
    backfills: dict[str, str] = field(default_factory=dict)
    blocked: int = 0  # the blocks reported (a live lease of another run is none)
    running: int = 0  # steps another run holds a live lease on: no block, nothing to do
    waiting: int = 0
    deferred: int = 0
    # Partitions whose judging met an outage: deferred whole, judged again next tick.
    outages: dict[str, Outage] = field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        if self.mode == "unchanged":
            return (
                f"resume tick [unchanged]: {self.partitions} partitions, nothing changed since "
                f"the last tick, nothing judged; {self.blocked} blocked; {self.seconds:.3f}s"
            )
        why = ", ".join(f"{k}={v}" for k, v in sorted(self.changed.items())) or "-"
        return (
            f"resume tick [{self.mode}]: {self.partitions} partitions, "
            f"{self.evaluated_partitions} re-judged ({why}), {self.judged} judge calls, "
            f"{self.pending} left for the next tick ({self.unjudged} never judged), "
            f"{self.row_queries} row queries ({self.rows_fetched} rows); {self.launches} "
            f"launches in {self.runs} runs ({self.held} partitions held behind runs in "
            f"flight{self.backfill_text()}), {self.running} running, {self.blocked} blocked, "
            f"{self.waiting} waiting, "
            f"{self.deferred} "
            f"deferred{self.outage_text()}; {self.seconds:.3f}s"
        )

    def backfill_text(self) -> str:
        """Which partitions are held for which backfill ("" when none is)."""
        if not self.backfills:
            return ""
        by_backfill: dict[str, list[str]] = {}
        for pk in sorted(self.backfills):
            by_backfill.setdefault(self.backfills[pk], []).append(pk)
        parts = []
        for backfill, keys in sorted(by_backfill.items()):
            named = ", ".join(keys[:_NAMED]) + (
                f" and {len(keys) - _NAMED} more" if len(keys) > _NAMED else ""
            )
            parts.append(f"backfill {backfill} targets {named}")
        return f" or backfills in progress, held: {'; '.join(parts)}"

    def outage_text(self) -> str:
        """Which partitions wait for which outage ("" when none did)."""
        if not self.outages:
            return ""
        by_code: dict[str, list[str]] = {}
        for pk in sorted(self.outages):
            by_code.setdefault(self.outages[pk].code, []).append(pk)
        parts = []
        for code, keys in sorted(by_code.items()):
            named = ", ".join(keys[:_NAMED]) + (
                f" and {len(keys) - _NAMED} more" if len(keys) > _NAMED else ""
            )
            verb = "waits" if len(keys) == 1 else "wait"
            parts.append(f"{named} {verb} for {code} ({self.outages[keys[0]].message})")
        return (
            f"; {len(self.outages)} partitions deferred by an outage, judged again next "
            f"tick: {'; '.join(parts)}"
        )


@dataclass
class TickResult:
    """What the sensor turns into run requests, check evaluations and its next cursor."""

    cursor: str
    launches: list[StepEvaluation]
    checks: list[CheckChange]
    evaluations: list[StepEvaluation]
    stats: TickStats
    # The partitions judged this tick (not those left over, nor those deferred by an outage).
    judged: frozenset[str] = frozenset()

    @property
    def changed(self) -> bool:
        return self.stats.mode != "unchanged"

    @property
    def runs(self) -> list[tuple[StepEvaluation, ...]]:
        """The launches as the runs to request: one per partition (its launches share one
        run key, docs/DESIGN.md#sensor), steps in dependency order."""
        grouped: dict[str | None, list[StepEvaluation]] = {}
        for ev in self.launches:
            grouped.setdefault(ev.run_key, []).append(ev)
        return [tuple(evs) for evs in grouped.values()]
