"""The full stores a run writes with: its row, checkpoint, artifacts, audit and seals.

The judge a run consults holds only their readers (``steps.readers``); the runner is given
the writing stores themselves (``StepRunner(judge, ledger=, checkpoints=)``) and hands them
to the modules of this package that write.
"""

from dataclasses import dataclass

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.context import ProviderMeter, StepContext
from pipeline_defs.steps.judge import StepJudge
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore


@dataclass(frozen=True)
class Writers:
    """The ledger and checkpoint store a run writes through (the judge's, in full)."""

    ledger: LedgerStore
    checkpoints: CheckpointStore

    def context(
        self,
        judge: StepJudge,
        key: StepKey,
        *,
        run_id: str,
        meter: ProviderMeter | None = None,
        redraw: frozenset[str] = frozenset(),
    ) -> StepContext:
        """The judge's context, owned by run ``run_id`` (and its providers, when metered)."""
        return StepContext.owned(
            judge.context(key),
            checkpoints=self.checkpoints,
            ledger=self.ledger,
            run_id=run_id,
            meter=meter,
            redraw=redraw,
        )
