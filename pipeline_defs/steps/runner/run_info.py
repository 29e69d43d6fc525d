"""Who is running a step (owner token, mode, launch path) and its judgement's history line."""

from dataclasses import dataclass

from pipeline_defs.resume.decision import LaunchMode, ResumeDecision
from pipeline_defs.steps.judge import AUTOMATIC_LAUNCH_PATH
from pipeline_defs.steps.redraw import Redraw
from resources.ledger.audit import Audit, AuditAction


@dataclass(frozen=True)
class RunInfo:
    """Who is running: the ledger owner token, the requested mode, the launch path."""

    run_id: str
    mode: LaunchMode = LaunchMode.RESUME
    launch_path: str = "api"
    redraw: Redraw | None = None  # the request (tags); resolved per step by ``run``
    redraw_items: frozenset[str] = frozenset()  # this step's targets, once resolved

    @property
    def automatic(self) -> bool:
        """Launched by the resume sensor: the only launches whose recoveries are counted
        . An operator's own launch is not an automatic recovery: counting it
         let three operator runs killed in a row exhaust the step against that operator."""
        return self.launch_path == AUTOMATIC_LAUNCH_PATH


def audit_line(
    run: RunInfo,
    decision: ResumeDecision,
    *,
    action: AuditAction,
    from_status: str | None,
    to_status: str | None,
    reason: str | None = None,
) -> Audit:
    """A history line of this run's judgement (docs/DESIGN.md#audit)."""
    return Audit(
        action=action,
        from_status=from_status,
        to_status=to_status,
        origin=decision.origin.value if decision.origin else None,
        reason=reason or decision.reason,
        run_id=run.run_id,
        launch_path=run.launch_path,
    )
