"""``storyboard seal``: seal the completed rows a ledger from before seals left unsealed.

A run seals its row when it publishes (and ``adopt`` when it adopts an orphan), but a
ledger migrated from before seals holds completed rows with no seal; the resume sensor is
read-only and never writes one, so every full refresh judges each of them the long way
(BENCHMARKS.md, "An unsealed 100,000-episode ledger stays expensive"). This judges each
such row the long way once, with the judge the runs and the sensor use, and only a clean
SKIP (completed, verified, nothing to re-run, no block) gets the seal the run would have
written. The write is a compare-and-set on the row as it was read
(``LedgerStore.seal_unchanged``), with its history line in the same transaction: a row a
run claimed, settled or re-sealed meanwhile is left alone. No status changes, no
checkpoint file is written.

On object storage the same: the checkpoint is loaded through its commit pointer and
verified against the manifest, the seal is the object seal a run writes there, and the
compare-and-set includes the pointer that was read.
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.decision_types import LaunchMode, ResumeAction
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from pipeline_defs.steps.judge import StepJudge
from resources.ledger.audit import Audit, AuditAction

SEAL_REASON = "verified clean the long way; sealed (storyboard seal)"


@dataclass
class SealReport:
    """What ``storyboard seal`` did, by step key."""

    sealed: list[str] = field(default_factory=list)
    already_sealed: int = 0
    # Judged other than a clean SKIP, or not sealable: the sensor and the runs deal with it.
    not_clean: dict[str, str] = field(default_factory=dict)  # step key -> the verdict
    changed: list[str] = field(default_factory=list)  # the row changed while it was judged

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "counts": {
                "sealed": len(self.sealed),
                "already_sealed": self.already_sealed,
                "not_clean": len(self.not_clean),
                "changed": len(self.changed),
            },
        }


def seal_completed(ws: Workspace, partition_keys: Sequence[str] = ()) -> SealReport:
    """Seal every completed, unsealed row (of these partitions; none: of all) whose
    checkpoint verifies clean."""
    ws.require_migrated_ledger()
    episodes: list[Episode] | None = None
    if partition_keys:
        episodes = ws.require_partitions(partition_keys, registration_required=False)
    rows = ws.ledger.get_many(episodes=episodes)
    judges: dict[str, StepJudge] = {}
    report = SealReport()
    for key in sorted(rows, key=str):
        row = rows[key]
        if row.status != StepStatus.COMPLETED:
            continue  # running rows are never touched; other settled rows carry no seal
        if row.checkpoint_seal is not None:
            report.already_sealed += 1
            continue
        if key.step_id not in ws.catalog:
            report.not_clean[str(key)] = f"the code location has no step {key.step_id!r}"
            continue
        if key.step_id not in judges:
            judges[key.step_id] = ws.judge(ws.step(key.step_id))
        _seal_one(ws, judges[key.step_id], key, row, report)
    return report


def _seal_one(
    ws: Workspace, judge: StepJudge, key: StepKey, row: LedgerRow, report: SealReport
) -> None:
    """Judge ``key`` the long way and seal it if the verdict is a clean SKIP."""
    loaded = judge.load_checkpoint(key)
    judgement = judge.judge(key, mode=LaunchMode.RESUME, row=row, loaded=loaded)
    decision = judgement.decision
    checkpoint = judgement.checkpoint
    clean = (
        decision.action is ResumeAction.SKIP
        and decision.origin is Origin.CLEAN
        and not decision.adopt
        and checkpoint is not None
        and checkpoint.status == StepStatus.COMPLETED
    )
    if not clean or checkpoint is None:
        report.not_clean[str(key)] = f"{decision.action.value}: {decision.reason}"
        return
    # The seal a run writes when it publishes (``verdicts.adopt`` builds it the same way).
    # None when a run would not have sealed it either: a file missing, a link, one written
    # within a timestamp tick, or (object storage) an input the storage does not hold.
    seal = ws.checkpoints.seal(
        checkpoint,
        judge.verifier_reads(judge.context(key)),
        revision=judge.step.verify_revision,
    )
    if seal is None:
        report.not_clean[str(key)] = "verified clean, but not sealable (as a run would not seal it)"
        return
    line = Audit(
        AuditAction.SEALED,
        from_status=StepStatus.COMPLETED,
        to_status=StepStatus.COMPLETED,
        origin=Origin.CLEAN.value,
        reason=SEAL_REASON,
        run_id=row.run_id,
        launch_path="cli",
    )
    if ws.ledger.seal_unchanged(key, seal, seen=row, audit=line):
        report.sealed.append(str(key))
    else:
        report.changed.append(str(key))
