"""Machines that share an in-memory ledger and an in-memory storage: the run protocol and
the judge over object storage (docs/DESIGN.md#storage) with no Dagster, no server, no file
but each machine's scratch.

A :class:`Machine` is what a worker, the sensor or the CLI is on a bucket: its own home
(scratch), the shared ledger (``open_memory_ledger``) and the shared storage
(``MemoryStorage``, both of ``resources/testing.py``), and the checkpoint store the product
builds over them with the pointers read from the ledger rows. The steps are the test steps
``alpha`` → ``beta`` → ``gamma`` of ``judge_steps.py``.
"""

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from judge_steps import PARTITION, STEPS, CountingTextModel, step_key

from pipeline_defs.judging.evaluation import evaluate_partitions
from pipeline_defs.judging.step_evaluation import StepEvaluation
from pipeline_defs.judging.stores import Stores
from pipeline_defs.resume.decision_types import LaunchMode, ResumeDecision
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.runner import RunInfo, StepOutcome, StepRunner
from resources.checkpoints.manifest import Manifest
from resources.checkpoints.published import published_checkpoints
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore
from resources.pipeline import LedgerPointers
from resources.providers import OfflineImageModel
from resources.storage import Storage
from resources.testing import MemoryStorage

GRAPH = StepGraph(STEPS)
BY_ID = {step.step_id: step for step in STEPS}


def published_store(home: Path, storage: Storage, ledger: LedgerStore) -> CheckpointStore:
    """The product's checkpoint store over ``storage`` with ``home`` as scratch and the
    pointers of the ledger rows, as ``resources/pipeline.py`` builds it."""
    return published_checkpoints(home, storage, LedgerPointers(ledger))


@dataclass
class Machine:
    """One process's view: its own scratch home, the shared ledger and storage."""

    home: Path
    ledger: LedgerStore
    storage: MemoryStorage
    checkpoints: CheckpointStore = field(init=False)

    def __post_init__(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.checkpoints = published_store(self.home, self.storage, self.ledger)

    @property
    def settings(self) -> ResumeSettings:
        return ResumeSettings(home=self.home)

    def judge_of(self, step_id: str) -> StepJudge:
        return StepJudge(
            BY_ID[step_id],
            graph=GRAPH,
            settings=self.settings,
            ledger=self.ledger,
            checkpoints=self.checkpoints,
        )

    def judge(self, step_id: str, mode: LaunchMode = LaunchMode.RESUME) -> ResumeDecision:
        """What a run judges first (``StepJudge.judge`` on the live row)."""
        key = step_key(step_id)
        return self.judge_of(step_id).judge(key, mode=mode, row=self.ledger.get(key)).decision

    def run(self, *step_ids: str, mode: LaunchMode = LaunchMode.RESUME) -> dict[str, StepOutcome]:
        """The run protocol without Dagster: judge, claim, execute, verify, fenced publish."""
        run = RunInfo(f"memory-{uuid.uuid4().hex[:8]}:0", mode, "api")
        outcomes: dict[str, StepOutcome] = {}
        for step_id in step_ids or tuple(BY_ID):
            runner = StepRunner(
                self.judge_of(step_id),
                ledger=self.ledger,
                checkpoints=self.checkpoints,
                models={"text": CountingTextModel(), "image": OfflineImageModel()},
            )
            inputs = {dep: self.checkpoints.load(step_key(dep)) for dep in BY_ID[step_id].deps}
            outcomes[step_id] = runner.run(PARTITION, run, inputs)
        return outcomes

    def evaluate(self, now: datetime) -> dict[str, StepEvaluation]:
        """What the resume sensor judges for the partition (batch judgement), by step."""
        stores = Stores(self.settings, self.ledger, self.checkpoints)
        return {e.step_id: e for e in evaluate_partitions(STEPS, stores, [PARTITION], now)}

    def manifest(self, step_id: str) -> Manifest:
        row = self.ledger.get(step_key(step_id))
        assert row is not None and row.checkpoint_pointer is not None, step_id
        return Manifest.decode(row.checkpoint_pointer)


def machines(root: Path, ledger: LedgerStore, storage: MemoryStorage) -> Iterator[Machine]:
    """Machines without end, each a fresh scratch home under ``root`` (a new process: its
    scratch starts empty)."""
    for n in itertools.count(1):
        yield Machine(root / f"machine-{n}", ledger, storage)
