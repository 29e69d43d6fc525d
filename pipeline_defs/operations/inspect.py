"""Read-only views for operators: status, shadow decisions, running-row audit.

Nothing here writes to the ledger, the checkpoints or the Dagster instance.
"""

import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.causes import root_cause_of_text
from pipeline_defs.resume.clock import (
    MAX_CLOCK_SKEW,
    beyond_clock_skew,
    format_timestamp,
    parse_timestamp,
)
from pipeline_defs.resume.decision import (
    CODE_RECOVERY_EXHAUSTED,
    FIRST_RUN_LABEL,
    FIRST_RUN_REASON,
    ResumeAction,
)
from pipeline_defs.resume.errors import ErrorCode
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus

if TYPE_CHECKING:  # at run time it stays imported where judged (_evaluate), as it was
    from pipeline_defs.judging.evaluation import StepEvaluation

# Audit actions that record a judge's verdict (the rest are follow-up transitions).
DECISION_ACTIONS = frozenset(
    {
        "skip",
        "adopt",
        "block",
        "rerun_self",
        "force_explicit",
        "redraw_explicit",
        "stale_running_recovery",
        "not_applicable",
        "claim_rejected",
    }
)


# Statuses whose run ended (it has a duration) and statuses waiting for a run.
_FINISHED = frozenset({StepStatus.COMPLETED, StepStatus.PARTIAL, StepStatus.FAILED})
_WAITING = frozenset({StepStatus.PENDING, StepStatus.STALE})


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


def _seconds_between(start: Any, end: Any) -> float | None:
    began, ended = parse_timestamp(start), parse_timestamp(end)
    if began is None or ended is None or ended < began:
        return None
    return round((ended - began).total_seconds(), 3)


def percentile(values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


# --------------------------------------------------------------------------- status
@dataclass
class StepState:
    partition: str
    step: str
    status: str
    # What the resume sensor (and ``decide``) does with it now: the same judgement, so a
    # block shows here as soon as the sensor and the UI show it, before any run records it.
    verdict: str | None = None
    block_code: str | None = None
    block_origin: str | None = None
    block_reason: str | None = None
    what_to_do: str | None = None
    # The last recorded decision of a run (history, from the audit rows).
    last_decision: str | None = None
    decided_at: str | None = None
    launch_path: str | None = None
    recovery_count: int = 0
    last_recovery_reason: str | None = None
    retry_not_before: str | None = None
    # Seconds of backoff left (retry_not_before in the future), else None.
    retry_in_seconds: float | None = None
    # Verdict "blocked" only because another run holds a live lease: not a fault, so
    # neither counted nor shown as a block (docs/DESIGN.md#leases).
    running_healthy: bool = False
    provider_calls: int = 0
    # Calls recorded as sent whose reply never came (the worker died during them): most
    # likely paid, outcome unknown.
    unknown_outcome_calls: int = 0
    last_duration_seconds: float | None = None
    run_id: str | None = None
    updated_at: str | None = None
    error: str | None = None


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
    # Over runs that finished (completed or partial), as the per-step p95: a failure's
    # duration says when it broke, not how long the step takes.
    p95_duration_seconds: float | None
    max_duration_seconds: float | None

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


@dataclass
class StatusReport:
    steps: list[StepState]
    totals: dict[str, Any]
    p95_duration_seconds: dict[str, float | None]
    summary: StatusSummary

    def as_dict(self) -> dict[str, Any]:
        return {
            # ``ledger_status`` is the stored value, to look the row up by.
            "steps": [
                {**asdict(s), "status": shown_status(s.status), "ledger_status": s.status}
                for s in self.steps
            ],
            "totals": self.totals,
            "p95_duration_seconds": self.p95_duration_seconds,
            "summary": self.summary.as_dict(),
        }


def _last_decisions(
    transitions: Iterable[Mapping[str, Any]],
) -> dict[StepKey, Mapping[str, Any]]:
    latest: dict[StepKey, Mapping[str, Any]] = {}
    for row in transitions:  # ordered by transition_seq
        if row["action"] in DECISION_ACTIONS:
            latest[StepKey(row["project_id"], row["episode_id"], row["step_id"])] = row
    return latest


def _queue(ws: Workspace, now: datetime) -> dict[str, Any]:
    """Queued Dagster runs and the age of the oldest (None without an instance)."""
    instance = ws.instance(required=False)
    if instance is None:
        return {"queued_runs": None, "oldest_queued_run_age_seconds": None}
    import dagster as dg

    records = instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]), limit=1000
    )
    created = [r.create_timestamp for r in records if r.create_timestamp is not None]
    oldest = min(created, default=None)
    age = round((now - oldest.astimezone(UTC)).total_seconds(), 1) if oldest else None
    return {"queued_runs": len(records), "oldest_queued_run_age_seconds": age}


def _in_flight(
    row: LedgerRow | None, run_id: str | None, lease_seconds: float, now: datetime
) -> bool:
    """An unfinished call of an owner that still holds a live lease: still being answered."""
    if row is None or row.status is not StepStatus.RUNNING or row.run_id != run_id:
        return False
    beat = parse_timestamp(row.heartbeat_at)
    return beat is not None and (now - beat).total_seconds() < lease_seconds


def status_report(
    ws: Workspace, partitions: tuple[str, ...] = (), now: datetime | None = None
) -> StatusReport:
    """Per partition and step: ledger state, the sensor's verdict now, blocks, costs, durations;
    and the summary of them an operator reads first (:class:`StatusSummary`).

    Blocks come from the same batch judgement as ``decide`` and the sensor
    (:func:`judge_now`), not from the last recorded decision: a change made since the last
    run (an edited story, a config change) blocks here exactly when it blocks there.
    """
    now = now or utc_now()
    ws.require_migrated_ledger()
    if partitions:
        episodes = ws.require_partitions(partitions, registration_required=False)
    else:
        episodes = ws.known_episodes()
    wanted = {e.partition_key for e in episodes}
    rows = ws.ledger.get_many(episodes=episodes) if episodes else {}
    audit = [t for t in ws.ledger.transitions() if f"{t['project_id']}/{t['episode_id']}" in wanted]
    decisions = _last_decisions(audit)
    evaluations = {(ev.partition_key, ev.step_id): ev for ev in _evaluate(ws, episodes, now)}
    ended = _owner_ended(ws)
    judged = {slot: _judged_item(ev, ended) for slot, ev in evaluations.items()}
    calls: dict[StepKey, int] = defaultdict(int)
    unknown: dict[StepKey, int] = defaultdict(int)
    for call in ws.ledger.provider_calls():
        key = StepKey(call["project_id"], call["episode_id"], call["step_id"])
        if key.partition_key in wanted:
            calls[key] += 1
            if call.get("finished_at") is None and not _in_flight(
                rows.get(key), call["run_id"], ws.settings.lease_seconds, now
            ):
                unknown[key] += 1  # sent, never answered: its worker died during it
    step_ids = [s.step_id for s in ws.steps]
    extra = sorted({k.step_id for k in rows} - set(step_ids))
    states: list[StepState] = []
    durations: dict[str, list[float]] = defaultdict(list)
    pending_ages: list[float] = []
    for episode in episodes:
        for step_id in (*step_ids, *extra):
            key = episode.step(step_id)
            row = rows.get(key)
            if row is None and step_id in extra:
                continue
            decision = decisions.get(key)
            state = StepState(
                partition=episode.partition_key,
                step=step_id,
                status=str(row.status) if row else "none",
                provider_calls=calls.get(key, 0),
                unknown_outcome_calls=unknown.get(key, 0),
            )
            now_judged = judged.get((episode.partition_key, step_id))
            if now_judged is not None:
                state.verdict = now_judged["verdict"]
                # A live lease of a run that has ended is no healthy run (the sensor relaunches it).
                state.running_healthy = (
                    evaluations[episode.partition_key, step_id].running_healthy
                    and now_judged["verdict"] == "blocked"
                )
                if now_judged["verdict"] == "blocked" and not state.running_healthy:
                    state.block_code = now_judged["code"]
                    state.block_origin = now_judged["origin"]
                    state.block_reason = now_judged["reason"]
                    state.what_to_do = now_judged["what_to_do"]
            if decision is not None:
                state.last_decision = shown_action(decision["action"], decision["reason"])
                state.decided_at = decision["at"]
                state.launch_path = decision["launch_path"]
            if row is not None:
                state.recovery_count = row.recovery_count
                state.last_recovery_reason = row.last_recovery_reason
                state.retry_not_before = row.retry_not_before
                retry = parse_timestamp(row.retry_not_before)
                if retry is not None and retry > now:
                    state.retry_in_seconds = round((retry - now).total_seconds(), 1)
                state.run_id = row.run_id
                state.updated_at = row.updated_at
                state.error = row.error_message
                if row.status in _FINISHED:
                    state.last_duration_seconds = _seconds_between(row.started_at, row.completed_at)
                    failed = row.status is StepStatus.FAILED
                    if state.last_duration_seconds is not None and not failed:
                        durations[step_id].append(state.last_duration_seconds)
                if row.status in _WAITING:
                    updated = parse_timestamp(row.updated_at)
                    if updated is not None:
                        pending_ages.append((now - updated).total_seconds())
            states.append(state)

    def count(pred: Callable[[StepState], bool]) -> int:
        return sum(1 for s in states if pred(s))

    # ``verdicts`` is the sensor's own tally, as ``decide`` prints it; ``blocked`` leaves
    # out the steps another run is working on (a live lease is no fault to act on).
    verdicts = verdict_counts(judged.values())
    queue = _queue(ws, now)
    totals: dict[str, Any] = {
        "partitions": len(episodes),
        "steps": len(states),
        "completed": count(lambda s: s.status == StepStatus.COMPLETED),
        "running": count(lambda s: s.status == StepStatus.RUNNING),
        "blocked": count(lambda s: s.verdict == "blocked" and not s.running_healthy),
        "failed": count(lambda s: s.status == StepStatus.FAILED),
        "partial": count(lambda s: s.status == StepStatus.PARTIAL),
        "pending": count(lambda s: s.status in _WAITING),
        "never_run": count(lambda s: s.status == "none"),
        "oldest_pending_age_seconds": round(max(pending_ages), 1) if pending_ages else None,
        "provider_calls": sum(s.provider_calls for s in states),
        "unknown_outcome_calls": sum(s.unknown_outcome_calls for s in states),
        "verdicts": verdicts,
        **queue,
    }
    p95 = {step_id: percentile(durations.get(step_id, []), 95) for step_id in step_ids}
    summary = StatusSummary(
        queue=_waiting(states, queue, now),
        leases=_leases(states, evaluations),
        recovery_exhausted=tuple(
            (s.partition, s.step) for s in states if s.block_code == CODE_RECOVERY_EXHAUSTED
        ),
        last_hour=last_hour(audit, now),
    )
    return StatusReport(states, totals, p95, summary)


# --------------------------------------------------------------------------- summary
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
_ENDING_CODES = {"finish": ErrorCode.STEP_EXECUTE_FAILED.value, "reset_running": "reset_running"}


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


def last_hour(transitions: Iterable[Mapping[str, Any]], now: datetime) -> LastHour:
    """Runs that ended in the last hour: counts by outcome, failure codes, durations.

    From the audit rows (``step_transition``), not the ledger rows: a row keeps only its
    latest run, so a step that failed twice and then completed within the hour counts
    three endings here. A run's duration is from its claim (the audit row that moved the
    step to running under its run id) to its ending.
    """
    since = now - LAST_HOUR
    claimed: dict[tuple[StepKey, str], datetime] = {}
    outcomes: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    durations: list[float] = []
    for row in transitions:  # ordered by transition_seq
        at = parse_timestamp(row["at"])
        run_id = row["run_id"]
        if at is None:
            continue
        key = StepKey(row["project_id"], row["episode_id"], row["step_id"])
        if row["to_status"] == StepStatus.RUNNING and run_id:
            claimed[key, run_id] = at  # a claim, or a takeover of an expired lease
            continue
        ended = row["from_status"] == StepStatus.RUNNING and row["to_status"] in _ENDED
        if not ended or at < since:
            continue
        outcome = str(row["to_status"])
        outcomes[outcome] += 1
        if outcome == StepStatus.FAILED:
            action = row["action"]
            codes[_ENDING_CODES.get(action) or failure_code(row["reason"])] += 1
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
        p95_duration_seconds=percentile(durations, 95),
        max_duration_seconds=max(durations, default=None),
    )


def _waiting(states: Sequence[StepState], queue: Mapping[str, Any], now: datetime) -> QueueSummary:
    queued = [s for s in states if s.verdict in QUEUED_VERDICTS]
    ages = [
        (now - updated).total_seconds()
        for s in queued
        if (updated := parse_timestamp(s.updated_at)) is not None
    ]
    return QueueSummary(
        launch=sum(1 for s in queued if s.verdict == "launch"),
        waiting=sum(1 for s in queued if s.verdict == "waiting"),
        deferred=sum(1 for s in queued if s.verdict == "deferred"),
        oldest_wait_seconds=round(max(ages), 1) if ages else None,
        queued_runs=queue["queued_runs"],
        oldest_queued_run_age_seconds=queue["oldest_queued_run_age_seconds"],
    )


def _leases(
    states: Sequence[StepState], evaluations: Mapping[tuple[str, str], "StepEvaluation"]
) -> LeaseSummary:
    """Leases as the sensor's judgement reads them, so this line and ``sensor now`` agree.

    A running row whose lease lapsed is judged STALE_RUNNING_RECOVERY, or blocked as
    ``step.recovery_exhausted`` when it may not be recovered again (the only automatic
    recovery of a running row is that one): expired and not reclaimed, either way. A row
    the judge cannot time (a clock beyond the allowed skew, an unreadable ``started_at``)
    is neither: it is a block with its own way out.
    """
    live = expired = 0
    for s in states:
        ev = evaluations.get((s.partition, s.step))
        if ev is None or s.status != StepStatus.RUNNING:
            continue
        if s.running_healthy:
            live += 1
        elif (
            s.verdict == "launch"  # a dead owner's row, whatever its heartbeat says
            or ev.decision.action is ResumeAction.STALE_RUNNING_RECOVERY
            or ev.decision.code == CODE_RECOVERY_EXHAUSTED
        ):
            expired += 1
    backoff = sum(1 for s in states if s.retry_in_seconds is not None)
    return LeaseSummary(live=live, expired_not_reclaimed=expired, in_backoff=backoff)


# --------------------------------------------------------------------------- shadow decide
def judge_now(ws: Workspace, episodes: Sequence[Episode], now: datetime) -> list[dict[str, Any]]:
    """What the resume sensor would do now, per partition and step. Writes nothing.

    The sensor's own batch evaluator (``pipeline_defs.judging.evaluation``): one ledger
    query, the judge in resume mode, launches only RERUN_SELF / STALE_RUNNING_RECOVERY whose
    upstream is settled, honoring backoff and recovery exhaustion. ``status`` and ``decide``
    both read it, so they cannot disagree with each other or with the sensor.
    """
    ended = _owner_ended(ws)
    return [_judged_item(ev, ended) for ev in _evaluate(ws, episodes, now)]


def _owner_ended(ws: Workspace) -> Callable[[str], str | None] | None:
    """The sensor's dead-owner rule (``owner_ended_in``) on this workspace's instance."""
    from pipeline_defs.steps.assets import owner_ended_in

    instance = ws.instance(required=False)
    return None if instance is None else owner_ended_in(instance)


# On object storage, ``decide``/``status`` of up to this many episodes compare them with
# the storage first (two LISTs each); beyond it they trust seals as the sensor does, whose
# scrub covers every episode once per ``scrub_period_seconds``.
SCRUBBED_BY_CLI = 50


def _evaluate(ws: Workspace, episodes: Sequence[Episode], now: datetime) -> list["StepEvaluation"]:
    from pipeline_defs.judging.evaluation import Stores, evaluate_partitions
    from pipeline_defs.judging.scrub import scrub_episodes

    stores = Stores(ws.settings, ws.ledger, ws.checkpoints)
    if len(episodes) <= SCRUBBED_BY_CLI:
        scrub_episodes(stores, episodes, clear=False)  # this process judges drift the long way
    return evaluate_partitions(ws.steps, stores, [e.partition_key for e in episodes], now)


def _judged_item(
    ev: "StepEvaluation", owner_ended: Callable[[str], str | None] | None = None
) -> dict[str, Any]:
    item = ev.as_dict()
    run_id = ev.facts.run_id
    if owner_ended is not None and ev.running_healthy and run_id:
        ended = owner_ended(str(run_id))
        if ended is not None:
            # Its heartbeat is fresh but its Dagster run has ended: the sensor relaunches it
            # now (docs/DESIGN.md#dead-owners), so no view may say it is being worked on.
            recovery = ResumeAction.STALE_RUNNING_RECOVERY.value
            item.update(
                verdict="launch",
                action=recovery,
                code=None,
                what_to_do="",
                detail=f"launch {recovery}: its owner run {run_id} ended ({ended})",
            )
            return item
    if ev.decision.first_run:  # the sensor launches it as RERUN_SELF; it re-runs nothing
        item["action"] = FIRST_RUN
        launch = f"launch {ResumeAction.RERUN_SELF.value}"
        if item["detail"] == launch or item["detail"].startswith(f"{launch},"):
            item["detail"] = f"launch {FIRST_RUN}" + item["detail"][len(launch) :]
    return item


def verdict_counts(judged: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """How many (step, partition) get each verdict: the one tally of status and decide."""
    counts: dict[str, int] = {}
    for item in judged:
        counts[item["verdict"]] = counts.get(item["verdict"], 0) + 1
    return dict(sorted(counts.items()))


def shadow_decisions(
    ws: Workspace, partitions: tuple[str, ...] = (), now: datetime | None = None
) -> list[dict[str, Any]]:
    """What the resume sensor would do now (:func:`judge_now`). Writes nothing.

    Without ``partitions`` it evaluates what the sensor does: the partitions registered in
    the Dagster instance (every known one without an instance). A named partition must be
    one the sensor evaluates, or one the ledger knows when there is no instance.
    """
    now = now or utc_now()
    ws.require_migrated_ledger()
    if partitions:
        has_instance = ws.instance(required=False) is not None
        episodes = ws.require_partitions(partitions, registration_required=has_instance)
    else:
        episodes = _sensor_episodes(ws)
    return judge_now(ws, episodes, now)


def _sensor_episodes(ws: Workspace) -> list[Episode]:
    """The sensor evaluates registered partitions; without an instance, every known one."""
    registered = ws.registered_episodes()
    if registered is None:
        return ws.known_episodes()
    return sorted(registered)


# --------------------------------------------------------------------------- running audit
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
                    "sensor recovers it (STALE_RUNNING_RECOVERY)"
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


def _dagster_status(instance: Any, owner: str | None) -> str | None:
    """Status of the Dagster run behind an owner token ``<run_id>:<attempt>``, if known."""
    if instance is None or not owner:
        return None
    run = instance.get_run_by_id(owner.split(":", 1)[0])
    return run.status.value if run is not None else None
