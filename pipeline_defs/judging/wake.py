"""When time alone changes a decision: the earliest moment a sleeping tick must wake for
(a lease lapsing, a future lease turning healthy, a backoff ending). Pure."""

import contextlib
from collections.abc import Iterable
from datetime import datetime, timedelta

from pipeline_defs.resume.clock import MAX_CLOCK_SKEW, as_utc, parse_timestamp
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow, StepStatus


def next_wake(
    rows: Iterable[LedgerRow], settings: ResumeSettings, now: datetime
) -> datetime | None:
    """Earliest future moment at which time alone can change a decision of these rows.

    A running row becomes stale at ``heartbeat_at + lease_seconds`` (without a heartbeat:
    ``started_at + running_timeout_seconds``), and a lease
    from beyond the allowed clock skew in the future turns from "investigate" to healthy
    at ``started_at - MAX_CLOCK_SKEW``; a backoff ends at ``retry_not_before``. Nothing
    else in the table depends on the clock. Moments past ``datetime.max`` (a year-9999
    ``started_at``) never come.
    """
    now = as_utc(now)
    timeout = timedelta(seconds=settings.running_timeout_seconds)
    lease = timedelta(seconds=settings.lease_seconds)
    found: list[datetime] = []
    for row in rows:
        if row.status is StepStatus.RUNNING:
            started = parse_timestamp(row.started_at)
            beat = parse_timestamp(row.heartbeat_at)
            if beat is not None:  # the lease lapses unless renewed (re-read at that time)
                with contextlib.suppress(OverflowError):
                    found.append(beat + lease)
            elif started is not None:
                with contextlib.suppress(OverflowError):
                    found.append(started + timeout)
            if started is not None:
                with contextlib.suppress(OverflowError):
                    found.append(started - MAX_CLOCK_SKEW)
        if row.retry_not_before is not None:  # most rows: no backoff, nothing to parse
            retry = parse_timestamp(row.retry_not_before)
            if retry is not None:
                found.append(retry)
    future = [t for t in found if t > now]
    return min(future) if future else None
