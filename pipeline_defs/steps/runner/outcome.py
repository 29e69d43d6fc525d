"""What a run of a step ends with: its outcome, and a final word already in the ledger."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pipeline_defs.resume.completion import CompletionReport
from pipeline_defs.resume.decision_types import ResumeDecision
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.mutations import Intent
from resources.checkpoints.envelope import Checkpoint


class OutcomeStatus(StrEnum):
    """``StepOutcome.status``: the status the run left in the ledger, or ``skip``.

    The values are the ledger's status texts (a run that publishes ``failed`` raises, so it
    has no outcome); ``skip`` is a SKIP, which leaves the row as it was.
    """

    COMPLETED = StepStatus.COMPLETED.value
    PARTIAL = StepStatus.PARTIAL.value
    NOT_APPLICABLE = StepStatus.NOT_APPLICABLE.value
    SKIP = "skip"

    @classmethod
    def published(cls, status: StepStatus) -> "OutcomeStatus":
        """The outcome of a run that published ``status`` (never ``failed``: it raised)."""
        return cls(status.value)


@dataclass(frozen=True)
class StepOutcome:
    decision: ResumeDecision
    status: OutcomeStatus
    checkpoint: Checkpoint | None
    provider_calls: int = 0
    mutated: tuple[str, ...] = ()
    report: CompletionReport | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Published:
    """A run's final word, now in the ledger (so a later failure is not recorded over it),
    and what is left to do after it."""

    status: StepStatus
    checkpoint: Checkpoint
    summary: str
    ctx: StepContext
    report: CompletionReport | None = None
    provider_calls: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    mutated: tuple[str, ...] = ()  # victims already brought to the published intents
    settle: tuple[Intent, ...] = ()  # a mutator's intents, applied after the publish
