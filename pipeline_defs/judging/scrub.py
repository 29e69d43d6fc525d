"""The budgeted scrub: published objects compared with the ledger, a slice per tick.

On object storage a judge trusts a row's seal without a request
(:mod:`resources.checkpoints.object_seal`), so an object deleted or overwritten behind the
ledger's back (by hand, by a lifecycle rule, by another tool) is not seen by looking at
the row. The scrub finds it: every episode gets one LIST of its checkpoint prefix and one
of its input folder per ``scrub_period_seconds`` (default 3600), spread evenly over the
ticks. The request rate is known in advance (10,000 episodes / 1 h ≈ 5.6 LIST/s, two per
episode) and so is the detection latency (at most one period plus a tick).

A seal the storage no longer matches is cleared in the ledger (compare-and-set on its
text): the row's ``updated_at`` moves, so the tick's cursor re-judges the partition the
long way, where the fetch verifies what is there (a deleted picture is a self-only re-run,
a replaced envelope a block naming the object), and every other process stops trusting
the seal too. On a local home (``scrubbable`` False) it does nothing: seals there are
re-checked by ``lstat`` each time they are used. Dagster-free.
"""

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from pipeline_defs.judging.scan import episode_of
from pipeline_defs.judging.stores import Stores
from pipeline_defs.resume.partition import Episode
from resources.checkpoints.object_seal import SealDrift

SCRUBBED_COLUMNS = ("checkpoint_pointer", "checkpoint_seal")


@dataclass
class ScrubReport:
    """What one scrub step compared and found (logged by the sensor, read by tests)."""

    episodes: int = 0
    drifts: list[SealDrift] = field(default_factory=list)
    cleared: int = 0  # seals cleared in the ledger (a drift whose seal moved on is not)


@dataclass
class Scrub:
    """Round-robin over the episodes: each tick scrubs the share of the period it covers.

    The position and the fractional carry live in process memory (the sensor's code server
    is long-lived); a restart starts the round again, which only moves the next check of
    some episodes earlier.
    """

    clock: Callable[[], float] = time.monotonic
    _position: int = 0
    _carry: float = 0.0
    _last: float | None = None

    def due(self, episodes: Sequence[Episode], period_seconds: float) -> list[Episode]:
        """The slice of ``episodes`` (sorted) whose turn it is, by time since the last call."""
        now = self.clock()
        elapsed = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        if not episodes:
            return []
        quota = len(episodes) * elapsed / period_seconds + self._carry
        take = min(len(episodes), math.floor(quota))
        self._carry = 0.0 if take == len(episodes) else quota - take
        start = self._position % len(episodes)
        chosen = [episodes[(start + i) % len(episodes)] for i in range(take)]
        self._position = (start + take) % len(episodes)
        return chosen

    def step(self, stores: Stores, partition_keys: Iterable[str]) -> ScrubReport:
        """Scrub this tick's share of the partitions and clear the seals found drifted."""
        report = ScrubReport()
        checkpoints = stores.checkpoints
        if not checkpoints.scrubbable:
            return report
        episodes = {e for e in map(episode_of, partition_keys) if e is not None}
        # The project configs first (one HEAD each, at most every few seconds): a config
        # replaced in the storage reaches the home's copy before the tick scans it, and the
        # judgement's own copy changes nothing the tick sees next time.
        for project_id in sorted({e.project_id for e in episodes}):
            checkpoints.sync_inputs(project_id)
        chosen = self.due(sorted(episodes), stores.settings.scrub_period_seconds)
        report.episodes = len(chosen)
        if not chosen:
            return report
        return scrub_episodes(stores, chosen, report, clear=True)


def scrub_episodes(
    stores: Stores,
    episodes: Sequence[Episode],
    report: ScrubReport | None = None,
    *,
    clear: bool,
) -> ScrubReport:
    """Compare ``episodes`` with the storage now (one ledger read for all of them).

    ``clear``: also clear the drifted seals in the ledger (the sensor); without it only this
    process judges those steps the long way (``storyboard decide``/``status``, which write
    nothing).
    """
    report = report or ScrubReport(episodes=len(episodes))
    checkpoints = stores.checkpoints
    if not checkpoints.scrubbable or not episodes:
        return report
    rows = stores.ledger.get_many(episodes=episodes, columns=SCRUBBED_COLUMNS)
    by_episode: dict[Episode, dict[str, tuple[str | None, str | None]]] = {}
    for key, row in rows.items():
        by_episode.setdefault(Episode(key.project_id, key.episode_id), {})[key.step_id] = (
            row.checkpoint_pointer,
            row.checkpoint_seal,
        )
    for episode in episodes:
        found = checkpoints.scrub(
            episode.project_id, episode.episode_id, by_episode.get(episode, {})
        )
        report.drifts.extend(found)
        if clear:
            report.cleared += sum(stores.ledger.clear_seal(d.step, d.seal) for d in found)
    return report


_SCRUBS: dict[str, Scrub] = {}


def scrub_for(name: str) -> Scrub:
    """The process-wide scrub of one sensor (its place in the round survives ticks)."""
    return _SCRUBS.setdefault(name, Scrub())
