"""The stores a batch judgement reads (:class:`ReadStores`: settings and the readers of
``steps.readers``), and the full ones for the code that writes (:class:`Stores`: the
sensor's scrub clears seals). Dagster-free.
"""

from dataclasses import dataclass
from typing import Protocol

from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.steps.readers import CheckpointReader, LedgerReader
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore


class PipelineLike(Protocol):
    """Anything that hands out the three stores, e.g. ``resources.pipeline.PipelineResource``."""

    def settings(self) -> ResumeSettings: ...

    def ledger(self) -> LedgerStore: ...

    def checkpoints(self) -> CheckpointStore: ...


@dataclass(frozen=True)
class ReadStores:
    """Settings and the ledger and checkpoint readers of one code location: what judging
    (``BatchJudge``, the tick) may use. A :class:`Stores` is one."""

    settings: ResumeSettings
    ledger: LedgerReader
    checkpoints: CheckpointReader


@dataclass(frozen=True)
class Stores(ReadStores):
    """Settings, ledger and checkpoint store of one code location, in full: for the code
    that writes (the sensor's scrub clears seals); judging takes it as its ``ReadStores``."""

    ledger: LedgerStore
    checkpoints: CheckpointStore

    @classmethod
    def of(cls, source: "Stores | PipelineLike") -> "Stores":
        if isinstance(source, Stores):
            return source
        return cls(source.settings(), source.ledger(), source.checkpoints())
