"""Verdicts shared or composed across steps: sealed SKIPs, and each partition's one run.

**Sealed verdicts are judged once per distinct state, not once per row.**

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

**One run per partition** (docs/DESIGN.md#sensor): :class:`PartitionRun` says which steps of
a partition the sensor puts in the one run it requests for it this tick.
"""

from collections.abc import Iterable
from datetime import datetime

from pipeline_defs.project import ProjectConfig
from pipeline_defs.resume.decision_types import (
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


class PartitionRun:
    """Which steps of one partition go in its one run this tick (docs/DESIGN.md#sensor).

    Fed in dependency order by the batch judge. A step joins on its own judgement only: it
    needs work (a launch action, no backoff) and every upstream step that is not settled is
    already in the run. Dagster runs the selection in dependency order, and each step
    judges itself again when the run reaches it (a step whose inputs turn out unchanged
    skips with no call). A settled step (a SKIP: clean, sealed, or verified) is never
    added for the sake of its upstream, so a re-run upstream never cascades into it; a
    deferred, blocked or running upstream keeps its downstream out (they wait for it).

    A not-applicable step without a record (no checkpoint yet) needs no work of its own,
    but the gate of a step below it needs that record: it is *offered* and goes in only
    when a step of the run waits on it. The run records it (no claim, no model call).
    """

    def __init__(self) -> None:
        self._joined: set[str] = set()
        self._offered: dict[str, tuple[str, ...]] = {}  # unrecorded not-applicable → waits

    def outside(self, waits: Iterable[str]) -> tuple[str, ...]:
        """Of the unsettled upstream steps ``waits``, those this run does not hold."""
        joined = self._joined
        return tuple(u for u in waits if u not in joined)

    def join(self, step_id: str) -> None:
        """``step_id`` needs work and every unsettled upstream step is in the run."""
        self._joined.add(step_id)

    def offer(self, step_id: str, waits: tuple[str, ...]) -> None:
        """An unrecorded not-applicable step: in the run if a step of it waits on it."""
        if not self.outside(waits):
            self._joined.add(step_id)
            self._offered[step_id] = waits

    def recorded(self, waited_on: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The offered steps that the run's steps wait on (each with its own waits)."""
        offered = self._offered
        return {u: offered[u] for u in dict.fromkeys(waited_on) if u in offered}
