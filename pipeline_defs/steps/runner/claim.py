"""What a claim needs besides the ledger's compare-and-set: the attempt it counts as, and
what an operator can do about the running row a refused claim lost to."""

from datetime import datetime

from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow


def attempts_of(row: LedgerRow | None, *, counted: bool) -> int:
    """This run's attempt number: the row's recoveries so far, plus this one if counted."""
    return max(1, (row.recovery_count if row is not None else 0) + (1 if counted else 0))


def lease_hint(key: StepKey, row: LedgerRow | None, settings: ResumeSettings, now: datetime) -> str:
    """What an operator can do about the running row a claim lost to (empty if none).

    Judged as the judge and ``audit-running`` judge a running row: by its lease (the
    heartbeat's age against ``lease_seconds``), by ``running_timeout_seconds`` only for
    a row without a heartbeat. A step that started hours ago and renewed its lease a
    moment ago is alive: no reset is offered for it. An explicit force never steals a
    lease, not even an expired one: say so, and how.
    """
    if row is None or not row.is_running:
        return ""
    owner, raw = row.run_id, row.started_at
    started = parse_timestamp(raw)
    reset = (
        f"storyboard reset-running --partition {key.partition_key} --step {key.step_id} "
        f"--expected-started-at {raw}"
    )
    if started is None:
        return f"; run {owner!r} holds it with an unreadable started_at {raw!r}"
    lease = settings.lease_seconds
    beat = parse_timestamp(row.heartbeat_at)
    if beat is not None:
        age = (now - beat).total_seconds()
        if age < lease:
            return (
                f"; run {owner!r} is working on it: last heartbeat {max(age, 0):.0f}s ago "
                f"(lease {lease:g}s, started {raw})"
            )
        return (
            f"; run {owner!r} holds an expired lease (last heartbeat {age:.0f}s ago, past "
            f"lease_seconds={lease:g}): a resume launch recovers it, or if that run is "
            f"dead: {reset}"
        )
    elapsed = (now - started).total_seconds()
    timeout = settings.running_timeout_seconds
    if elapsed >= timeout:
        return (
            f"; run {owner!r} holds an expired lease (no heartbeat, started {raw}, "
            f"{elapsed:.0f}s ago, past running_timeout_seconds={timeout}): a resume launch "
            f"recovers it, or if that run is dead: {reset}"
        )
    return f"; run {owner!r} has held it for {elapsed:.0f}s (started {raw}, no heartbeat)"
