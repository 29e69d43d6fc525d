"""Sealed verdicts judged once per distinct state, not once per row.

A completed row whose seal holds is judged from the seal's summary alone: ``decide``
(docs/DESIGN.md#decision-table) then reads the row's status (completed), the summary
(schema version, config hash and fingerprints), the step's scoped config of the project
and whether the step applies; the clean verdict is a SKIP, which no limit (recovery
count, backoff) and no clock touches. A cold tick over 10,000 episodes meets a handful of
such states 100,000 times, so the judge runs once per (step, project config, summary)
and the SKIP is shared.

Only SKIPs are shared (any other outcome is judged per row: a re-run looks at links in
its way, recoveries at the row's counts), and only for steps whose ``is_applicable`` is
the default (an override may look at the episode).
"""

from datetime import datetime

from pipeline_defs.project import ProjectConfig
from pipeline_defs.resume.decision import (
    CheckpointSummary,
    LaunchMode,
    ResumeAction,
    ResumeDecision,
)
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.spec import Step
from resources.checkpoints.seal import Seal

_Slot = tuple[str, int, int]


class SealedVerdicts:
    """The SKIPs of holding seals, by (step, project config, summary) (one evaluation)."""

    def __init__(self) -> None:
        self._skips: dict[_Slot, tuple[ProjectConfig, CheckpointSummary, ResumeDecision]] = {}

    def clear(self) -> None:
        self._skips.clear()

    def decide(
        self, judge: StepJudge, key: StepKey, row: LedgerRow, now: datetime, sealed: Seal
    ) -> ResumeDecision:
        """``judge.judge(key, row=row, sealed=sealed)``'s decision for a completed ``row``."""
        if type(judge.step).is_applicable is not Step.is_applicable:
            return judge.judge(
                key, mode=LaunchMode.RESUME, row=row, now=now, sealed=sealed
            ).decision
        project = judge.project(key)  # raises as judge() would (e.g. a bad project file)
        summary = sealed.summary
        # Identities, held by the entry (so never reused): summaries are shared by the seal
        # decoder, a project config is replaced when its file changes.
        slot = (key.step_id, id(project), id(summary))
        hit = self._skips.get(slot)
        if hit is not None and hit[0] is project and hit[1] is summary:
            return hit[2]
        decision = judge.judge(
            key, mode=LaunchMode.RESUME, row=row, now=now, sealed=sealed
        ).decision
        if decision.action is ResumeAction.SKIP:
            self._skips[slot] = (project, summary, decision)
        return decision
