"""The words the operator views use: decision actions, statuses and verdicts as operators
read them, and the small helpers every view shares (now, a percentile).
"""

import math
from collections.abc import Sequence
from datetime import UTC, datetime

from pipeline_defs.resume.decision_types import FIRST_RUN_LABEL, FIRST_RUN_REASON, ResumeAction
from pipeline_defs.resume.status import StepStatus
from resources.ledger.audit import VERDICT_ACTIONS

# Audit actions that record a judge's verdict (the rest are follow-up transitions).
DECISION_ACTIONS = VERDICT_ACTIONS


# Words operators read where one stored word means two things. The ledger
# keeps its status values and the judge its actions; only what the views show differs.
FIRST_RUN = FIRST_RUN_LABEL  # a RERUN_SELF of a step that never ran: it re-runs nothing
INVALIDATED = "invalidated"  # ledger status "stale": a force upstream invalidated the row
LEASE_EXPIRED = "lease_expired"  # a running row whose owner stopped renewing its lease


def shown_status(status: str) -> str:
    """A ledger status as operators read it: ``stale`` is shown as ``invalidated``."""
    return INVALIDATED if status == StepStatus.STALE else status


def shown_action(action: str, reason: str | None) -> str:
    """A recorded decision as operators read it: a first run is not a re-run."""
    first = action == ResumeAction.RERUN_SELF and reason == FIRST_RUN_REASON
    return FIRST_RUN if first else action


def utc_now() -> datetime:
    return datetime.now(UTC)


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]
