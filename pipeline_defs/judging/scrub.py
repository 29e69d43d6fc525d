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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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

    The place in the round (the next episode's key), the time of the last share and the
    fractional carry live in process memory and in the sensor's cursor (:meth:`state`,
    :meth:`resume`): a code server restarted more often than the period goes on where the
    round was instead of starting it again (the episodes at its end would never be
    scrubbed). Wall-clock time, so it means the same in the next process.
    """

    clock: Callable[[], float] = time.time
    _position: int = 0
    _carry: float = 0.0
    _last: float | None = None
    _next: str | None = None  # the partition key whose turn is next, from a cursor

    def state(self) -> dict[str, Any]:
        """Where the round is, for the cursor (None while nothing was scrubbed yet)."""
        return {"next": self._next, "at": self._last, "carry": self._carry}

    def resume(self, state: Mapping[str, Any] | None) -> None:
        """Go on from a cursor's state, if this process has not started a round itself."""
        if self._last is not None or not isinstance(state, Mapping):
            return
        at, carry, nxt = state.get("at"), state.get("carry"), state.get("next")
        if isinstance(at, int | float) and not isinstance(at, bool):
            self._last = float(at)
        if isinstance(carry, int | float) and not isinstance(carry, bool):
            self._carry = max(0.0, float(carry))
        if isinstance(nxt, str):
            self._next = nxt

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
        if self._next is not None:  # resumed from a cursor: the first episode from that key
            keys = [e.partition_key for e in episodes]
            self._position = next((i for i, k in enumerate(keys) if k >= self._next), 0)
        start = self._position % len(episodes)
        chosen = [episodes[(start + i) % len(episodes)] for i in range(take)]
        self._position = (start + take) % len(episodes)
        self._next = episodes[self._position].partition_key
        return chosen

    def step(
        self,
        stores: Stores,
        partition_keys: Iterable[str],
        resume: Mapping[str, Any] | None = None,
    ) -> ScrubReport:
        """Scrub this tick's share of the partitions and clear the seals found drifted;
        ``resume``: the round's state from the sensor's cursor (a restarted process)."""
        self.resume(resume)
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
        round_before = (self._position, self._carry, self._last, self._next)
        chosen = self.due(sorted(episodes), stores.settings.scrub_period_seconds)
        report.episodes = len(chosen)
        if not chosen:
            return report
        try:
            return scrub_episodes(stores, chosen, report, clear=True)
        except Exception:
            # Not scrubbed (an outage of the storage or the ledger): the round stays where
            # it was, so this share is taken again by the next tick instead of being lost.
            self._position, self._carry, self._last, self._next = round_before
            raise


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
