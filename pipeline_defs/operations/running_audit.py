"""``storyboard audit-running``: every running ledger row, bucketed as the judge sees it,
with the operator's way out of each bucket.
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pipeline_defs.operations.operator_words import LEASE_EXPIRED, utc_now
from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.clock import MAX_CLOCK_SKEW, beyond_clock_skew, parse_timestamp
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.lease import abandoned_after_seconds

# "future": started_at (or, the owner run not ended, heartbeat_at) lies beyond the allowed
# clock skew ahead of now. The judge blocks such a row like an unparseable one (it would
# otherwise never time out), so it is not counted as healthy here either.
RUNNING_BUCKETS = (
    "healthy",
    LEASE_EXPIRED,
    "dead_owner",
    "unparseable",
    "null_started_at",
    "future",
)
ENDED_STATUSES = frozenset({"FAILURE", "CANCELED", "SUCCESS"})


@dataclass
class RunningRow:
    partition: str
    step: str
    bucket: str  # one of RUNNING_BUCKETS
    started_at: str | None
    elapsed_seconds: float | None
    run_id: str | None
    lock_owner: str | None
    heartbeat_at: str | None
    dagster_run_status: str | None = None
    hint: str = ""
    heartbeat_age_seconds: float | None = None


def audit_running(ws: Workspace, now: datetime | None = None) -> list[RunningRow]:
    """Every running ledger row, bucketed as the judge sees it: a dead owner run, the lease
    (heartbeat age), or ``running_timeout_seconds`` for a row without heartbeat."""
    now = now or utc_now()
    ws.require_migrated_ledger()
    timeout = ws.settings.running_timeout_seconds
    lease = ws.settings.lease_seconds
    instance = ws.instance(required=False)
    out: list[RunningRow] = []
    for row in ws.ledger.running_rows():
        key = StepKey(str(row.project_id), str(row.episode_id), str(row.step_id))
        raw = row.started_at
        started = parse_timestamp(raw)
        elapsed = round((now - started).total_seconds(), 1) if started else None
        reset = f"storyboard reset-running --partition {key.partition_key} --step {key.step_id}"
        dagster_status = _dagster_status(instance, row.run_id)
        beat = parse_timestamp(row.heartbeat_at)
        beat_age = round((now - beat).total_seconds(), 1) if beat else None
        if raw is None:
            bucket, hint = "null_started_at", f"investigate, then: {reset} --null-started-at"
        elif started is None:
            bucket = "unparseable"
            hint = f"investigate, then: {reset} --expected-started-at {raw!r}"
        elif beyond_clock_skew(started, now):
            bucket = "future"
            hint = (
                f"started_at is {-(elapsed or 0):.0f}s in the future (more than the "
                f"{MAX_CLOCK_SKEW.total_seconds():.0f}s allowed clock skew; check the owner "
                f"host's clock); the judge blocks it: investigate, then: {reset} "
                f"--expected-started-at {raw!r}"
            )
        elif dagster_status in ENDED_STATUSES:  # docs/DESIGN.md#dead-owners
            bucket = "dead_owner"
            hint = (
                f"owner run ended ({dagster_status}); the resume sensor recovers it at its next "
                "tick (STALE_RUNNING_RECOVERY)"
            )
        elif beat is not None and beyond_clock_skew(beat, now):  # as the judge: investigate
            bucket = "future"
            hint = (
                f"heartbeat_at is {-(beat_age or 0):.0f}s in the future (more than the "
                f"{MAX_CLOCK_SKEW.total_seconds():.0f}s allowed clock skew; check the owner "
                f"host's clock); the judge blocks it: investigate, then: {reset} "
                f"--expected-started-at {raw!r}"
            )
        elif beat is not None:  # the judge's lease rule
            if beat_age is not None and beat_age < lease:
                bucket = "healthy"
                hint = f"heartbeat {max(beat_age, 0):.0f}s ago (lease {lease:g}s): owner alive"
            else:
                bucket = LEASE_EXPIRED
                hint = (
                    f"heartbeat {beat_age:.0f}s old, past the {lease:g}s lease: the resume "
                    "sensor requests its recovery (STALE_RUNNING_RECOVERY)"
                    + _queue_hint(dagster_status, beat_age, lease, ws.settings.heartbeat_seconds)
                )
        elif elapsed is not None and elapsed < timeout:  # a row without heartbeat
            bucket, hint = "healthy", f"owner has {timeout - elapsed:.0f}s left before the timeout"
        else:
            bucket = LEASE_EXPIRED  # no heartbeat (a row from before leases): the timeout
            hint = (
                f"started {elapsed or 0:.0f}s ago, past the {timeout}s running timeout: the "
                "resume sensor recovers it (STALE_RUNNING_RECOVERY)"
            )
        out.append(
            RunningRow(
                partition=key.partition_key,
                step=key.step_id,
                bucket=bucket,
                started_at=raw,
                elapsed_seconds=elapsed,
                run_id=row.run_id,
                lock_owner=row.lock_owner,
                heartbeat_at=row.heartbeat_at,
                dagster_run_status=dagster_status,
                hint=hint,
                heartbeat_age_seconds=beat_age,
            )
        )
    return sorted(out, key=lambda r: (r.partition, r.step))


def _queue_hint(
    dagster_status: str | None, beat_age: float | None, lease: float, beats: float
) -> str:
    """What frees the episode's run queue when the owner run still shows as running here: a
    run nobody ends would hold it (sensors.abandoned_runs ends it on the ledger's evidence)."""
    if dagster_status not in ("STARTED", "STARTING", "CANCELING"):
        return ""
    limit = abandoned_after_seconds(lease, beats)
    if beat_age is not None and beat_age > limit:
        when = "at its next tick"
    else:
        when = f"once the heartbeat is {limit:g}s old"
    return (
        f"; its owner run still shows {dagster_status}: the sensor marks it failed {when}, "
        "so the episode's run queue lets the recovery start"
    )


def _dagster_status(instance: Any, owner: str | None) -> str | None:
    """Status of the Dagster run behind an owner token ``<run_id>:<attempt>``, if known."""
    if instance is None or not owner:
        return None
    run = instance.get_run_by_id(owner.split(":", 1)[0])
    return run.status.value if run is not None else None
