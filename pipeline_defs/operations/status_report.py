"""``storyboard status``: per partition and step, the ledger state, the sensor's verdict
now, blocks, costs and durations; and the :class:`StatusSummary` of them.
"""

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pipeline_defs.operations.operator_words import (
    DECISION_ACTIONS,
    percentile,
    shown_action,
    shown_status,
    utc_now,
)
from pipeline_defs.operations.shadow_decide import (
    evaluate_now,
    judged_item,
    owner_ended_rule,
    verdict_counts,
)
from pipeline_defs.operations.status_spend import SpendReport, spend_report
from pipeline_defs.operations.status_summary import (
    QUEUED_VERDICTS,
    LeaseSummary,
    QueueHolder,
    QueueSummary,
    StatusSummary,
    UnservedQueue,
    last_hour,
)
from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.decision_types import (
    CLAIMING_ACTIONS,
    CODE_RECOVERY_EXHAUSTED,
    ResumeAction,
)
from pipeline_defs.resume.fleet_settings import UNSERVED_QUEUE_TAG
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from resources.ledger.audit import AuditAction, Transition
from resources.ledger.store import LedgerStore

if TYPE_CHECKING:  # at run time it is imported where judged (shadow_decide.evaluate_now)
    from pipeline_defs.judging.step_evaluation import StepEvaluation

# Statuses whose run ended (it has a duration) and statuses waiting for a run.
_FINISHED = frozenset({StepStatus.COMPLETED, StepStatus.PARTIAL, StepStatus.FAILED})
_WAITING = frozenset({StepStatus.PENDING, StepStatus.STALE})


# At most this many runs' step timings are read from the Dagster instance per ``status``
# (the newest finished rows' runs); older rows show the ledger's claim-to-finish time.
RUN_TIMINGS_READ = 200


def _run_step_durations(
    ws: Workspace, rows: Mapping[StepKey, LedgerRow]
) -> dict[tuple[str, str], float]:
    """(Dagster run id, step) -> the step's duration in that run, from the run's events
    (step start to its end): what the run's own report says, judge, inputs and publish
    included. Empty without a Dagster instance."""
    from pipeline_defs.wiring.assets import owner_run_id

    instance = ws.instance(required=False)
    if instance is None:
        return {}
    runs: dict[str, None] = {}
    finished = [r for r in rows.values() if r.status in _FINISHED and r.run_id]
    for row in sorted(finished, key=lambda r: str(r.completed_at or ""), reverse=True):
        run_id = owner_run_id(str(row.run_id))
        if run_id is not None:
            runs.setdefault(run_id, None)
        if len(runs) >= RUN_TIMINGS_READ:
            break
    out: dict[tuple[str, str], float] = {}
    for run_id in runs:
        for stats in instance.get_run_step_stats(run_id):
            if stats.start_time is not None and stats.end_time is not None:
                out[run_id, stats.step_key] = round(stats.end_time - stats.start_time, 3)
    return out


def _seconds_between(start: Any, end: Any) -> float | None:
    began, ended = parse_timestamp(start), parse_timestamp(end)
    if began is None or ended is None or ended < began:
        return None
    return round((ended - began).total_seconds(), 3)


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
    # Seconds its run still waits for the shared rate limit (docs/DESIGN.md#rate-limit).
    rate_wait_seconds: float | None = None
    provider_calls: int = 0
    # Calls recorded as sent whose reply never came (the worker died during them): most
    # likely paid, outcome unknown.
    unknown_outcome_calls: int = 0
    # Two measures of the step's latest run, each named for what it is: the step in its
    # Dagster run, start to end as the run's events time it (judging, inputs, the claim, the
    # body, publish; None when the instance does not know the run), and its claim to its end
    # in the ledger (the body, its verification and publish: what the last hour measures).
    last_run_step_seconds: float | None = None
    last_claimed_seconds: float | None = None
    run_id: str | None = None
    # The worker whose claim made the step's latest run, in its history line's words (`host:pid`;
    # a fleet worker as started, then its pool child: `storyboard-1@vm, child vm:2`).
    worker: str | None = None
    updated_at: str | None = None
    error: str | None = None


@dataclass
class StatusReport:
    steps: list[StepState]
    totals: dict[str, Any]
    p95_claimed_seconds: dict[str, float | None]  # per step, over the finished rows
    summary: StatusSummary
    # Per episode and project, today (UTC) and in all, in calls and money, beside the money
    # budgets set (docs/DESIGN.md#money-budgets).
    spend: SpendReport

    def as_dict(self) -> dict[str, Any]:
        return {
            # ``ledger_status`` is the stored value, to look the row up by.
            "steps": [
                {**asdict(s), "status": shown_status(s.status), "ledger_status": s.status}
                for s in self.steps
            ],
            "totals": self.totals,
            "p95_claimed_seconds": self.p95_claimed_seconds,
            "summary": self.summary.as_dict(),
            "spend": self.spend.as_dict(),
        }


# The verdicts a run claims a step on (its history line moves the row to ``running``).
_CLAIMS = frozenset(AuditAction(action.value) for action in CLAIMING_ACTIONS)


def _claim_workers(transitions: Iterable[Transition]) -> dict[StepKey, str | None]:
    """Per step, the worker named by its latest claim line (a claim's verdict, into
    ``running``; a refused claim stays out)."""
    found: dict[StepKey, str | None] = {}
    for row in transitions:  # ordered by transition_seq
        if row.to_status is StepStatus.RUNNING and row.action in _CLAIMS:
            found[row.key] = row.worker
    return found


def _last_decisions(transitions: Iterable[Transition]) -> dict[StepKey, Transition]:
    latest: dict[StepKey, Transition] = {}
    for row in transitions:  # ordered by transition_seq
        if row.action in DECISION_ACTIONS:
            latest[row.key] = row
    return latest


def _queue(ws: Workspace, now: datetime) -> dict[str, Any]:
    """Queued Dagster runs, the age of the oldest, and the runs that hold a partition's queue
    (None without an instance)."""
    instance = ws.instance(required=False)
    if instance is None:
        return {
            "queued_runs": None,
            "oldest_queued_run_age_seconds": None,
            "held_by": None,
            "unserved_queues": None,
        }
    import dagster as dg

    records = instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED]), limit=1000
    )
    created = [r.create_timestamp for r in records if r.create_timestamp is not None]
    oldest = min(created, default=None)
    age = round((now - oldest.astimezone(UTC)).total_seconds(), 1) if oldest else None
    return {
        "queued_runs": len(records),
        "oldest_queued_run_age_seconds": age,
        "held_by": queue_holders(ws.ledger, instance, [r.dagster_run for r in records], now),
        "unserved_queues": unserved_queues(instance),
    }


def unserved_queues(instance: Any) -> tuple[UnservedQueue, ...]:
    """Started runs whose coordinator found no worker consuming a queue their steps wait on:
    the run tag it keeps (one query; the broker is not asked here)."""
    import dagster as dg

    started = instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]), limit=1000
    )
    found = []
    for record in started:
        run = record.dagster_run
        for queue in filter(None, run.tags.get(UNSERVED_QUEUE_TAG, "").split(",")):
            partition = run.tags.get("dagster/partition")
            found.append(UnservedQueue(run.run_id, partition, queue))
    return tuple(sorted(found, key=lambda u: (u.queue, u.partition or "", u.run_id)))


# A run that has left the queue and not ended: it holds its partition's one slot.
_HOLDING = ("NOT_STARTED", "STARTING", "STARTED", "CANCELING")


def queue_holders(
    ledger: LedgerStore, instance: Any, queued: Sequence[Any], now: datetime
) -> tuple[QueueHolder, ...]:
    """Per partition with a run waiting in the queue, the runs that hold its slot (the shipped
    run queue starts one run per ``dagster/partition``), with the ledger's word on them: the
    silence of their claims (a run whose claims all stopped heartbeating is a dead worker,
    ended by the resume sensor once silent past its lease and a heartbeat)."""
    import dagster as dg

    waiting = Counter(
        str(run.tags["dagster/partition"]) for run in queued if "dagster/partition" in run.tags
    )
    if not waiting:
        return ()
    holding = instance.get_run_records(
        filters=dg.RunsFilter(
            statuses=[dg.DagsterRunStatus(s) for s in _HOLDING],
            tags={"dagster/partition": sorted(waiting)},
        ),
        limit=1000,
    )
    silence: dict[str, list[float | None]] = defaultdict(list)
    for row in ledger.running_rows():
        seen = parse_timestamp(row.heartbeat_at) or parse_timestamp(row.started_at)
        run_id = str(row.run_id or "").split(":", 1)[0]
        silence[run_id].append(None if seen is None else (now - seen).total_seconds())
    holders = []
    for record in holding:
        run = record.dagster_run
        quiet = silence.get(run.run_id, [])
        silent_for = (
            round(min(q for q in quiet if q is not None), 1)
            if quiet and None not in quiet
            else None
        )
        holders.append(
            QueueHolder(
                partition=str(run.tags["dagster/partition"]),
                run_id=run.run_id,
                status=run.status.value,
                queued_behind=waiting[str(run.tags["dagster/partition"])],
                claims=len(quiet),
                claims_silent_seconds=silent_for,
            )
        )
    return tuple(sorted(holders, key=lambda h: (h.partition, h.run_id)))


def _in_flight(
    row: LedgerRow | None, run_id: str | None, lease_seconds: float, now: datetime
) -> bool:
    """An unfinished call of an owner that still holds a live lease: still being answered."""
    if row is None or row.status is not StepStatus.RUNNING or row.run_id != run_id:
        return False
    beat = parse_timestamp(row.heartbeat_at)
    return beat is not None and (now - beat).total_seconds() < lease_seconds


# Up to this many episodes, status reads their history and calls by key, not whole tables.
MAX_EPISODES_READ_BY_KEY = 500


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
    # The episodes' own lines and calls, read by episode (a few hundred at most: past that, a
    # list of pairs costs the database more than one scan of the tables it filters).
    scope = episodes if len(episodes) <= MAX_EPISODES_READ_BY_KEY else None
    audit = [t for t in ws.ledger.transitions(episodes=scope) if t.key.partition_key in wanted]
    decisions = _last_decisions(audit)
    workers = _claim_workers(audit)
    evaluations = {(ev.partition_key, ev.step_id): ev for ev in evaluate_now(ws, episodes, now)}
    ended = owner_ended_rule(ws)
    judged = {slot: judged_item(ev, ended) for slot, ev in evaluations.items()}
    calls: dict[StepKey, int] = defaultdict(int)
    unknown: dict[StepKey, int] = defaultdict(int)
    for call in ws.ledger.provider_calls(episodes=scope):
        key = StepKey(call["project_id"], call["episode_id"], call["step_id"])
        if key.partition_key in wanted:
            calls[key] += 1
            if call.get("finished_at") is None and not _in_flight(
                rows.get(key), call["run_id"], ws.settings.lease_seconds, now
            ):
                unknown[key] += 1  # sent, never answered: its worker died during it
    rate_waits = ws.ledger.rate_limits.waits()
    step_ids = [s.step_id for s in ws.steps]
    extra = sorted({k.step_id for k in rows} - set(step_ids))
    run_durations = _run_step_durations(ws, rows)
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
                worker=workers.get(key),
            )
            wait = rate_waits.get(key)
            until = parse_timestamp(wait.until) if wait is not None else None
            if (
                wait is not None
                and until is not None
                and row is not None
                and row.run_id == wait.run_id
            ):
                state.rate_wait_seconds = max(0.0, (until - now).total_seconds())
            now_judged = judged.get((episode.partition_key, step_id))
            if now_judged is not None:
                state.verdict = now_judged["verdict"]
                # A live lease of a run that has ended is no healthy run (the sensor relaunches it).
                state.running_healthy = (
                    evaluations[episode.partition_key, step_id].running_healthy
                    and now_judged["verdict"] == "running"
                )
                if now_judged["verdict"] == "blocked" and not state.running_healthy:
                    state.block_code = now_judged["code"]
                    state.block_origin = now_judged["origin"]
                    state.block_reason = now_judged["reason"]
                    state.what_to_do = now_judged["what_to_do"]
            if decision is not None:
                state.last_decision = shown_action(str(decision.action), decision.reason)
                state.decided_at = decision.at
                state.launch_path = decision.launch_path
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
                    # The run's own timing of the step (none when the instance does not know
                    # the run: another deployment's, or pruned), and the ledger's claim to end.
                    run_id = str(row.run_id or "").split(":", 1)[0]
                    state.last_run_step_seconds = run_durations.get((run_id, step_id))
                    state.last_claimed_seconds = _seconds_between(row.started_at, row.completed_at)
                    failed = row.status is StepStatus.FAILED
                    if state.last_claimed_seconds is not None and not failed:
                        durations[step_id].append(state.last_claimed_seconds)
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
    spend = spend_report(ws, episodes, now, by_episode=scope is not None)
    return StatusReport(states, totals, p95, summary, spend)


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
        held_by=queue["held_by"],
        unserved_queues=queue["unserved_queues"],
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
