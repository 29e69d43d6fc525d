"""Read-only views for operators: status, shadow decisions, running-row audit.

Nothing here writes to the ledger, the checkpoints or the Dagster instance. Each view lives
in a module of its own; this module keeps the names the CLI and the tests import:

- :mod:`~pipeline_defs.operations.operator_words`: the words operators read, shared helpers;
- :mod:`~pipeline_defs.operations.status_report`: ``storyboard status``, per step;
- :mod:`~pipeline_defs.operations.status_summary`: its summary (queue, leases, last hour);
- :mod:`~pipeline_defs.operations.shadow_decide`: ``storyboard decide``, the sensor's view;
- :mod:`~pipeline_defs.operations.running_audit`: ``storyboard audit-running``.
"""

from pipeline_defs.operations.operator_words import (
    DECISION_ACTIONS,
    FIRST_RUN,
    INVALIDATED,
    LEASE_EXPIRED,
    percentile,
    shown_action,
    shown_status,
    utc_now,
)
from pipeline_defs.operations.running_audit import (
    ENDED_STATUSES,
    RUNNING_BUCKETS,
    RunningRow,
    audit_running,
)
from pipeline_defs.operations.shadow_decide import (
    SCRUBBED_BY_CLI,
    judge_now,
    shadow_decisions,
    verdict_counts,
)
from pipeline_defs.operations.status_report import StatusReport, StepState, status_report
from pipeline_defs.operations.status_summary import (
    LAST_HOUR,
    QUEUED_VERDICTS,
    LastHour,
    LeaseSummary,
    QueueHolder,
    QueueSummary,
    StatusSummary,
    failure_code,
    last_hour,
)

__all__ = [
    "DECISION_ACTIONS",
    "ENDED_STATUSES",
    "FIRST_RUN",
    "INVALIDATED",
    "LAST_HOUR",
    "LEASE_EXPIRED",
    "QUEUED_VERDICTS",
    "RUNNING_BUCKETS",
    "SCRUBBED_BY_CLI",
    "LastHour",
    "LeaseSummary",
    "QueueHolder",
    "QueueSummary",
    "RunningRow",
    "StatusReport",
    "StatusSummary",
    "StepState",
    "audit_running",
    "failure_code",
    "judge_now",
    "last_hour",
    "percentile",
    "shadow_decisions",
    "shown_action",
    "shown_status",
    "status_report",
    "utc_now",
    "verdict_counts",
]
