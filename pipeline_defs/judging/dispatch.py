"""Where a tick's batch is judged: in this process in budgeted slices, or in worker processes.

Big batches (a cold tick, a full refresh) go to a persistent pool of judge processes on
machines with 4+ CPUs (:mod:`pipeline_defs.judging.parallel`); a pool that cannot start or
breaks is given up and the batch is judged here. Judging stops after the deadline: the
partitions left over are returned unjudged, so the next tick judges them first, and so
are the partitions whose judging met an outage (named in ``JudgeDispatch.outages``).
"""

import time
from collections.abc import Mapping, Sequence
from datetime import datetime

from pipeline_defs.judging.evaluation import BatchJudge, rows_by_partition
from pipeline_defs.judging.parallel import JudgePool, JudgeSpec, default_workers
from pipeline_defs.judging.scan import NO_SCAN, PartitionScan, Scan
from pipeline_defs.judging.step_evaluation import Outage, PartitionRows, StepEvaluation
from pipeline_defs.judging.stores import ReadStores
from pipeline_defs.resume.identity import Identity
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow

_BUDGET_SLICE = 100  # partitions judged between two looks at the clock


class JudgeDispatch:
    """The tick's judge: the in-process :class:`BatchJudge` and, for big batches, a pool."""

    def __init__(
        self,
        judge: BatchJudge,
        stores: ReadStores,
        *,
        workers: int | None,
        parallel_from: int,
        trust_seals: bool,
    ) -> None:
        self.judge = judge
        self.stores = stores
        self.workers = workers  # None = parallel.default_workers()
        self.parallel_from = parallel_from
        self.trust_seals = trust_seals
        self.pool: JudgePool | None = None
        self.pool_failed = False
        # The last batch's partitions deferred by an outage (not among those judged).
        self.outages: dict[str, Outage] = {}

    def pool_size(self, partitions: int) -> int:
        workers = self.workers or default_workers()
        if workers < 2 or partitions < self.parallel_from or self.pool_failed:
            return 1
        if not self.stores.checkpoints.poolable:  # workers would judge a local tree instead
            return 1
        return workers

    def _pool(self) -> JudgePool:
        if self.pool is None:
            spec = JudgeSpec(
                steps=self.judge.steps,
                home=str(self.stores.checkpoints.home),
                ledger_url=self.stores.ledger.url,
                settings=self.stores.settings,
                trust_seals=self.trust_seals,
            )
            self.pool = JudgePool(spec, self.workers or default_workers())
        return self.pool

    def warm(self) -> None:
        """Start the workers now (they build the judge while the tick scans and reads)."""
        try:
            self._pool().warm()
        except Exception:  # e.g. a step that cannot be pickled: judge in process
            self.pool_failed = True
            self.close()

    def judge_batch(
        self,
        chosen: Sequence[str],
        now: datetime,
        rows: Mapping[StepKey, LedgerRow],
        scanned: Mapping[str, Scan],
        shape: PartitionScan,
        blocked: Mapping[str, str],
        deadline: float,
        *,
        grouped: Mapping[str, PartitionRows] | None = None,
    ) -> tuple[list[StepEvaluation], int, list[str]]:
        """(evaluations, judge calls, partitions judged) of ``chosen`` until ``deadline``.

        Big batches go to the worker processes (their results leave out SKIPs).
        ``grouped``: ``rows_by_partition(rows)`` if the caller has it already. A partition
        whose judging met an outage is not judged: it is in ``outages`` instead.
        """
        self.outages = {}

        def lookup(pk: str, step_id: str) -> Identity:
            """Step-directory identities from the scan (no second stat while judging)."""
            return shape.step_identity(scanned.get(pk, NO_SCAN).ints, step_id)

        if self.pool_size(len(chosen)) > 1:
            try:
                directories = {pk: {s: lookup(pk, s) for s in self.judge.step_ids} for pk in chosen}
                result = self._pool().evaluate(chosen, now, rows, directories, blocked, deadline)
            except Exception:  # a broken pool must not stop the sensor: judge here
                self.pool_failed = True
                self.close()
            else:
                for step_id, subs in result.artifact_dirs.items():
                    self.judge.artifact_dirs.setdefault(step_id, set()).update(subs)
                self.outages = dict(result.outages)
                return result.evaluations, result.judged, result.partitions
        if grouped is None:
            grouped = rows_by_partition(rows)  # once, not per slice
        before = self.judge.judged
        evaluations: list[StepEvaluation] = []
        done: list[str] = []
        for start in range(0, len(chosen), _BUDGET_SLICE):
            if start and time.perf_counter() >= deadline:
                break
            part = chosen[start : start + _BUDGET_SLICE]
            evaluations.extend(  # SKIPs only where they clear a block, as in the workers
                self.judge.evaluate(
                    part, now, rows, directories=lookup, keep_skips=blocked, grouped=grouped
                )
            )
            self.outages.update(self.judge.outages)
            done.extend(pk for pk in part if pk not in self.judge.outages)
        return evaluations, self.judge.judged - before, done

    def close(self) -> None:
        """Stop the worker processes (if any)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
