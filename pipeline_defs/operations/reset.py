"""``storyboard reset-running``: a stuck running row reset to failed, only if unchanged."""

from typing import Any

from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import Episode, StepKey, validate_id
from pipeline_defs.resume.status import StepStatus


def reset_running(
    ws: Workspace,
    partition_key: str,
    step_id: str,
    expected_started_at: str | None,
    reason: str,
) -> dict[str, Any]:
    """Expected-match reset of a running row to failed; refuses if the row changed.

    The step and the partition are checked first, so a typo is named as one instead of
    being reported as a row that does not exist. A step the code location no longer has
    is accepted while the ledger still holds a row of it (that row may be stuck too).
    """
    validate_id(step_id, "step_id")
    if step_id not in ws.catalog and not (
        ws.ledger_ready() and ws.ledger.get(Episode.parse(partition_key).step(step_id))
    ):
        ws.step(step_id)  # raises, listing the steps the code location has
    episode = ws.require_partitions([partition_key], registration_required=False)[0]
    key: StepKey = episode.step(step_id)
    ws.require_migrated_ledger()
    before = ws.ledger.get(key)
    if not ws.ledger.reset_running(key, expected_started_at, reason):
        found = (
            "there is no ledger row for it"
            if before is None
            else f"the row is {before.status} with started_at {before.started_at!r}"
        )
        raise PipelineError(
            ErrorCode.STEP_RESET_REFUSED,
            f"{key}: refused: {found}, expected running with started_at "
            f"{expected_started_at!r}; nothing changed",
            status=409,
        )
    ws.ledger.append_transition(
        key,
        action="reset_running",
        from_status=StepStatus.RUNNING,
        to_status=StepStatus.FAILED,
        reason=reason,
        run_id=before.run_id if before else None,
        launch_path="cli",
    )
    return {
        "partition": partition_key,
        "step": step_id,
        "from": StepStatus.RUNNING.value,
        "to": StepStatus.FAILED.value,
        "previous_run_id": before.run_id if before else None,
        "started_at": expected_started_at,
        "reason": reason,
    }
