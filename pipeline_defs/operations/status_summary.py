"""The summary an operator reads first in ``storyboard status``: the queue, the leases,
exhausted recoveries, and the last hour's run endings from the audit rows.
"""

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from pipeline_defs.operations.operator_words import percentile
from pipeline_defs.resume.causes import root_cause_of_text
from pipeline_defs.resume.clock import format_timestamp, parse_timestamp
from pipeline_defs.resume.errors import ErrorCode
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from resources.ledger.audit import AuditAction, Transition


@dataclass(frozen=True)
class QueueHolder:
    """A run that holds a partition's slot in the run queue while others wait behind it."""

    partition: str
    run_id: str
    status: str  # its Dagster status (STARTED, ...)
    queued_behind: int  # runs of the partition waiting in the queue
    claims: int  # running ledger rows it owns
    # Since the most recent heartbeat of its claims; None when it owns none (or one without
    # a readable time): then the ledger says nothing of its worker.
    claims_silent_seconds: float | None


@dataclass(frozen=True)
class UnservedQueue:
    """A started run whose steps wait on a Celery queue no worker consumes, as its coordinator
    last found it (the run's ``storyboard/unserved_queue`` tag, docs/DESIGN.md#fleet)."""

    run_id: str
    partition: str | None
    queue: str


@dataclass(frozen=True)
class QueueSummary:
    """What waits for the sensor: steps it launches now, steps waiting on an upstream step,
    steps in backoff, and how long the oldest of them has waited."""

    launch: int
    waiting: int
    deferred: int
    # Age of the oldest queued step's ledger row (since its ``updated_at``: when it failed,
    # was invalidated or last changed); a step that never ran has no row and no age.
    oldest_wait_seconds: float | None
    # Dagster runs queued for a slot (None without an instance).
    queued_runs: int | None
    oldest_queued_run_age_seconds: float | None
    # The runs holding the queue of a partition with runs waiting (None without an instance).
    held_by: tuple[QueueHolder, ...] | None = None
    # Started runs whose steps wait on a queue no worker consumes (None without an instance).
    unserved_queues: tuple[UnservedQueue, ...] | None = None


@dataclass(frozen=True)
class LeaseSummary:
    """Running rows as the judge sees them (docs/DESIGN.md#leases), and rows in backoff."""

    live: int  # an owner renews its lease: left alone
    expired_not_reclaimed: int  # the lease lapsed and no run has taken the row over yet
    in_backoff: int  # ``retry_not_before`` in the future (docs/DESIGN.md#decision-table row 13)


@dataclass(frozen=True)
class LastHour:
    """Runs that ended at or after ``since`` (an hour before now), from the audit rows."""

    since: str
    completed: int
    partial: int
    failed: int
    failure_codes: tuple[tuple[str, int], ...]  # most frequent first
    # "claimed": from a step's claim to its end (its history lines), as the per-step
    # ``last_claimed_seconds``; not the step in its run (``last_run_step_seconds``: judging
    # and inputs before the claim too). Over runs that finished (completed or partial), as
    # the per-step p95: a failure's duration says when it broke, not how long the step takes.
    p95_claimed_seconds: float | None
    max_claimed_seconds: float | None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "failure_codes": dict(self.failure_codes)}


@dataclass(frozen=True)
class StatusSummary:
    """The operator's question in one place: the queue, the leases, what only an operator
    can unblock (exhausted recoveries) and the last hour."""

    queue: QueueSummary
    leases: LeaseSummary
    recovery_exhausted: tuple[tuple[str, str], ...]  # (partition, step)
    last_hour: LastHour

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": asdict(self.queue),
            "leases": asdict(self.leases),
            "recovery_exhausted": [
                {"partition": partition, "step": step}
                for partition, step in self.recovery_exhausted
            ],
            "last_hour": self.last_hour.as_dict(),
        }


LAST_HOUR = timedelta(hours=1)
# The sensor's verdicts for a step it runs now or later without an operator.
QUEUED_VERDICTS = ("launch", "waiting", "deferred")
# Run endings in the audit: (from running) to one of these, by ``finish``, ``failed`` (a
# run's own failure) or ``reset_running`` (an operator's). A takeover (running → running)
# is a claim, not an ending.
_ENDED = frozenset({StepStatus.COMPLETED, StepStatus.PARTIAL, StepStatus.FAILED})
# ``PipelineError`` text starts with its code: ``[provider.retries_exhausted] ...``.
_CODE_PREFIX = re.compile(r"\s*\[([a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*)\]")
# What an ending that carries no error text failed with: ``finish`` records the failed
# status of a run whose every item failed (the runner then raises ``step.execute_failed``);
# ``reset_running`` is an operator's word, not an error: it is named as the action.
_ENDING_CODES: dict[str, str] = {
    AuditAction.FINISH: ErrorCode.STEP_EXECUTE_FAILED.value,
    AuditAction.RESET_RUNNING: AuditAction.RESET_RUNNING.value,
}


def failure_code(text: str | None) -> str:
    """The typed code of a failure known only as its recorded text.

    A ``PipelineError`` keeps its ``[code]``; anything else is typed as the CLI types a
    failure it reads as text (:func:`root_cause_of_text`: a storage fault by its errno or
    the ledger driver's words, else ``internal``).
    """
    if not text:
        return ErrorCode.INTERNAL.value
    found = _CODE_PREFIX.match(text)
    return found.group(1) if found else root_cause_of_text(text).code


def last_hour(transitions: Iterable[Transition], now: datetime) -> LastHour:
    """Runs that ended in the last hour: counts by outcome, failure codes, durations.

    From the audit rows (``step_transition``), not the ledger rows: a row keeps only its
    latest run, so a step that failed twice and then completed within the hour counts
    three endings here. A run's time ("claimed") is from its claim (the audit row that
    moved the step to running under its run id) to its ending.
    """
    since = now - LAST_HOUR
    claimed: dict[tuple[StepKey, str], datetime] = {}
    outcomes: Counter[StepStatus] = Counter()
    codes: Counter[str] = Counter()
    durations: list[float] = []
    for row in transitions:  # ordered by transition_seq
        at = parse_timestamp(row.at)
        run_id = row.run_id
        if at is None:
            continue
        key = row.key
        if row.to_status is StepStatus.RUNNING and run_id:
            claimed[key, run_id] = at  # a claim, or a takeover of an expired lease
            continue
        outcome = row.to_status
        ended = row.from_status is StepStatus.RUNNING and outcome in _ENDED
        if not ended or at < since or outcome is None:  # (None is never in _ENDED)
            continue
        outcomes[outcome] += 1
        if outcome is StepStatus.FAILED:
            codes[_ENDING_CODES.get(row.action) or failure_code(row.reason)] += 1
            continue
        began = claimed.get((key, run_id)) if run_id else None
        if began is not None and at >= began:
            durations.append(round((at - began).total_seconds(), 3))
    return LastHour(
        since=format_timestamp(since),
        completed=outcomes[StepStatus.COMPLETED],
        partial=outcomes[StepStatus.PARTIAL],
        failed=outcomes[StepStatus.FAILED],
        failure_codes=tuple(sorted(codes.items(), key=lambda item: (-item[1], item[0]))),
        p95_claimed_seconds=percentile(durations, 95),
        max_claimed_seconds=max(durations, default=None),
    )
