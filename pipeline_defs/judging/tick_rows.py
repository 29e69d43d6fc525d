"""The ledger rows a resume tick judges with (:class:`TickRows`). Dagster-free.

A cold tick or a full refresh reads the rows of every partition at once; an incremental
tick reads only those of the partitions it targets and those touched in the ledger since
the last tick (looked back by ``skew_seconds`` for writers with skewed clocks), or, when
there are too many to name, everything in one read. Each read is counted in the tick's
stats (``row_queries``, ``rows_fetched``).
"""

from collections.abc import Mapping, Sequence
from datetime import timedelta

from pipeline_defs.judging.scan import episode_of
from pipeline_defs.judging.step_evaluation import JUDGED_COLUMNS
from pipeline_defs.judging.tick_result import TickConfig, TickStats
from pipeline_defs.resume.clock import format_timestamp, parse_timestamp
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.steps.readers import LedgerReader

# Partitions per targeted row read: the ledger store filters up to 500 (project, episode)
# pairs in a query (its _PAIR_FILTER_LIMIT), and reads more partitions' projects whole.
_ROWS_PER_READ = 500


class TickRows:
    """The ledger reads of one ticker: its steps' rows, in the columns the judge reads."""

    def __init__(self, ledger: LedgerReader, step_ids: Sequence[str]) -> None:
        self.ledger = ledger
        self.step_ids = tuple(step_ids)

    def read(
        self,
        keys: Sequence[str],
        changed_since: tuple[int, str] | None,
        stats: TickStats,
        *,
        targeted: bool = False,
    ) -> dict[StepKey, LedgerRow]:
        """The rows of ``keys`` (and those changed since), in one read; ``targeted``: some
        of the partitions only, read in slices the ledger store filters by (project,
        episode) pairs (one read of more pairs reads their projects' rows whole)."""
        episodes = [e for e in (episode_of(pk) for pk in keys) if e is not None]
        if not episodes and changed_since is None:
            return {}
        slices = (
            [episodes[i : i + _ROWS_PER_READ] for i in range(0, len(episodes), _ROWS_PER_READ)]
            if targeted and changed_since is None
            else [episodes]
        )
        rows: dict[StepKey, LedgerRow] = {}
        for part in slices:
            stats.row_queries += 1
            rows.update(
                self.ledger.get_many(
                    episodes=part,
                    step_ids=self.step_ids,
                    changed_since=changed_since,
                    columns=JUDGED_COLUMNS,
                )
            )
        stats.rows_fetched += len(rows)
        return rows

    def incremental(
        self,
        targets: Mapping[str, str],
        last: tuple[int, str] | None,
        marker: tuple[int, str],
        stats: TickStats,
        total: int,
        config: TickConfig,
    ) -> dict[StepKey, LedgerRow] | None:
        """The rows of ``targets`` and of the partitions touched in the ledger since the
        last tick (whose ledger marker was ``last``; this tick's is ``marker``); None when
        there are too many to name (one full read is cheaper): more than
        ``config.max_targeted`` and than a quarter of all ``total`` partitions."""
        if len(targets) > max(config.max_targeted, total // 4):
            return None
        if last == marker:
            return self.read(list(targets), None, stats, targeted=True) if targets else {}
        assert last is not None
        seq, updated = last
        since = parse_timestamp(updated)
        if since is None:
            return None
        back = format_timestamp(since - timedelta(seconds=config.skew_seconds))
        if not targets:
            return self.read([], (seq, back), stats)
        # Partitions touched in the ledger, and the ones changed on disk: two reads, each
        # driven by an index. Asked in one query (``touched OR listed``), the OR keeps
        # PostgreSQL from using either index: it scanned the whole table, 0.1 s per 20,000
        # rows of server time while the tick waited (benchmarks/sensor_tick.py, 1 % tick).
        rows = self.read([], (seq, back), stats)
        rows.update(self.read(list(targets), None, stats, targeted=True))
        return rows
