"""An explicit force, once claimed: the step's own artifacts cleaned up, and every
downstream row staled with its checkpoint archived (never under a live run)."""

from dataclasses import replace

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.runner.run_info import RunInfo
from pipeline_defs.steps.runner.writers import Writers
from resources.ledger.audit import Audit, AuditAction


def force_cleanup(judge: StepJudge, key: StepKey, ctx: StepContext) -> None:
    """The step's own cleanup of what a forced re-run replaces."""
    cleanup = judge.step.cleanup_artifacts(ctx)
    judge.log.info("%s: force cleanup: %s", key, cleanup.note)


def invalidate_downstream(
    judge: StepJudge, writers: Writers, key: StepKey, run: RunInfo
) -> list[StepKey]:
    """Explicit force only: downstream rows → stale, their checkpoints archived + marked."""
    ledger, checkpoints = writers.ledger, writers.checkpoints
    targets = judge.downstream_keys(key)
    if not targets:
        return []
    for target in targets:  # again under our claim, before the first row changes
        checkpoints.refuse_links_in_tree(target)
    reason = f"invalidated by explicit force of {key.step_id} (run {run.run_id})"
    line = Audit(
        AuditAction.INVALIDATE,
        from_status=None,
        to_status=StepStatus.STALE,
        reason=reason,
        run_id=run.run_id,
        launch_path=run.launch_path,
    )
    rows = ledger.get_many(episodes=[key.episode], step_ids=[t.step_id for t in targets])
    # Each row staled commits with its history line (docs/DESIGN.md#audit).
    staled = set(ledger.invalidate(targets, reason, audit=line))
    cleared: list[StepKey] = []
    for target in targets:
        row = rows.get(target)
        before = row.status if row is not None else None
        if before == StepStatus.RUNNING and target not in staled:
            continue  # its owner will publish; never clear under a live run
        checkpoints.force_clear(target)
        cleared.append(target)
        if target not in staled:  # no row to stale: the clearing alone is recorded
            ledger.append_audit(target, replace(line, from_status=before, to_status=before))
    return cleared
