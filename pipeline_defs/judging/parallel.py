"""Judging big batches (a cold tick, a full refresh) in worker processes. Dagster-free.

The judge is CPU-bound Python (seal checks; for unsealed steps envelope parsing, content
and artifact hashes, verifiers), so a batch of thousands of partitions is split into
chunks judged by a persistent pool of *spawned* processes (no fork: the sensor runs
inside a threaded gRPC code server). Each worker rebuilds the same
:class:`~pipeline_defs.judging.evaluation.BatchJudge` from a picklable spec for every chunk (a fresh
envelope cache per chunk keeps its memory flat). Workers return only what the sensor acts
on (everything but SKIP, plus the slots it asks for), so the result transfer stays small.
Any pool failure falls back to judging in the calling process.
"""

import multiprocessing
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pipeline_defs.judging.evaluation import BatchJudge
from pipeline_defs.judging.step_evaluation import Outage, StepEvaluation
from pipeline_defs.judging.stores import ReadStores
from pipeline_defs.resume.identity import ABSENT, Identity
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.steps.spec import Step
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore


@dataclass(frozen=True)
class JudgeSpec:
    """What a worker needs to rebuild the judge (picklable: steps pickle by class)."""

    steps: tuple[Step, ...]
    home: str
    ledger_url: str
    settings: ResumeSettings
    trust_seals: bool = True


@dataclass
class ChunkResult:
    """A chunk's evaluations the caller acts on, and bookkeeping."""

    evaluations: list[StepEvaluation]
    judged: int
    artifact_dirs: dict[str, list[str]] = field(default_factory=dict)
    partitions: list[str] = field(default_factory=list)  # the partitions judged
    outages: dict[str, Outage] = field(default_factory=dict)  # deferred, not judged


_SPEC: JudgeSpec | None = None


def _init_worker(spec: JudgeSpec) -> None:
    global _SPEC
    _SPEC = spec


def _ready() -> int:
    return os.getpid()


def judge_chunk(
    keys: Sequence[str],
    rows: Mapping[StepKey, LedgerRow],
    now: datetime,
    directories: Mapping[str, Mapping[str, Identity]],
    keep: frozenset[str],
) -> ChunkResult:
    """Judge ``keys`` in this worker; return non-SKIP evaluations and the ``keep`` slots.

    Each chunk gets a fresh checkpoint store, so a worker's envelope cache (and memory)
    never grows beyond one chunk; the calling process keeps the long-lived cache.
    """
    spec = _SPEC
    assert spec is not None, "worker not initialised"
    stores = ReadStores(  # judging only: the stores as their readers
        settings=spec.settings,
        ledger=LedgerStore(spec.ledger_url),
        checkpoints=CheckpointStore(Path(spec.home)),
    )
    judge = BatchJudge(spec.steps, stores, trust_seals=spec.trust_seals)
    wanted = judge.evaluate(
        keys,
        now,
        rows,
        directories=lambda pk, step: directories.get(pk, {}).get(step, ABSENT),
        keep_skips=keep,
    )
    dirs = {k: sorted(v) for k, v in judge.artifact_dirs.items() if v}
    judged = [pk for pk in keys if pk not in judge.outages]
    return ChunkResult(wanted, judge.judged, dirs, judged, dict(judge.outages))


def default_workers() -> int:
    """One worker per CPU but one (left to the daemon and runs), at most 8; none below 4 CPUs.

    Measured on 2 CPUs: two workers were slower than judging in process (start-up and
    transfer cost, and the CPUs are shared with everything else).
    """
    cpus = os.cpu_count() or 1
    return 1 if cpus < 4 else min(8, cpus - 1)


class JudgePool:
    """A lazily started, persistent pool of judge workers."""

    def __init__(self, spec: JudgeSpec, workers: int) -> None:
        self.spec = spec
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None
        self.broken: BaseException | None = None

    def warm(self) -> None:
        """Start the workers now (they import and build the judge while we scan)."""
        if self._executor is None and self.broken is None:
            self._executor = ProcessPoolExecutor(
                max_workers=self.workers,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(self.spec,),
            )
            for _ in range(self.workers):
                self._executor.submit(_ready)

    def evaluate(
        self,
        keys: Sequence[str],
        now: datetime,
        rows: Mapping[StepKey, LedgerRow],
        directories: Mapping[str, Mapping[str, Identity]],
        keep: Iterable[str],
        deadline: float | None = None,
    ) -> ChunkResult:
        """Judge ``keys`` across the workers; chunks not done by ``deadline`` are dropped.

        ``deadline`` is a ``time.perf_counter()`` value; ``partitions`` of the result says
        which keys were judged.
        """
        self.warm()
        assert self._executor is not None
        kept = frozenset(keep)
        by_pk: dict[str, dict[StepKey, LedgerRow]] = {}
        for key, row in rows.items():
            by_pk.setdefault(key.partition_key, {})[key] = row
        size = max(50, -(-len(keys) // (self.workers * 4)))
        futures: list[Future[ChunkResult]] = []
        for start in range(0, len(keys), size):
            chunk = list(keys[start : start + size])
            chunk_rows = {k: r for pk in chunk for k, r in by_pk.get(pk, {}).items()}
            chunk_dirs = {pk: directories.get(pk, {}) for pk in chunk}
            futures.append(
                self._executor.submit(judge_chunk, chunk, chunk_rows, now, chunk_dirs, kept)
            )
        total = ChunkResult([], 0, {})
        remaining = None if deadline is None else max(0.0, deadline - time.perf_counter())
        try:
            for future in as_completed(futures, timeout=remaining):
                part = future.result()
                total.evaluations.extend(part.evaluations)
                total.judged += part.judged
                total.partitions.extend(part.partitions)
                total.outages.update(part.outages)
                for step_id, subs in part.artifact_dirs.items():
                    merged = set(total.artifact_dirs.get(step_id, ())) | set(subs)
                    total.artifact_dirs[step_id] = sorted(merged)
        except FuturesTimeout:
            for future in futures:
                future.cancel()  # not started yet: left for the next tick
        return total

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
