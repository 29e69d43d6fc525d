"""``resume_sensor``: judge every (step, partition) of ``episodes`` and act on the verdicts.

Per tick (see :mod:`pipeline_defs.judging.tick` for what counts as a change and what a tick costs):

- ONE ``RunRequest(asset_selection=[steps...], partition_key=pk)`` per partition with
  work (docs/DESIGN.md#sensor): every step that needs work on its own judgement
  (RERUN_SELF or STALE_RUNNING_RECOVERY, never FORCE_EXPLICIT: the sensor always judges in
  resume mode; no backoff) and whose unsettled upstream steps are all in that run. Dagster
  runs the selection in dependency order and skips what is below a step that fails; each
  step judges itself again when the run reaches it. A settled step is never selected for
  the sake of its upstream, and a step below a deferred, running or blocked one waits.
  The run key is derived from the steps, the partition and the states that caused the
  decisions, so Dagster launches it once until one of them changes. While a run of the
  partition's steps is in flight (queued, starting, started), the partition's request
  waits for it: the steps that run has not reached yet would look like work and race it
  (stale-lease recoveries excepted, see :func:`pipeline_defs.judging.plan.hold_back`); and
  while a backfill in progress targets the partition, nothing of it is requested (the
  backfill launches its run: :mod:`pipeline_defs.wiring.backfills`), until the backfill has
  ended. Tags:
  ``resume/action``, ``resume/origin`` and ``resume/reason`` of the run's cause (its first
  step launched for work of its own; the reason cut to Dagster's 63-character tag-value
  limit), ``resume/state`` (the digest in the run key), ``resume/steps`` (how many).
- a ``resume_integrity`` check evaluation on the asset partition for every block whose
  state changed (failed, with origin / reason / code / what to do) and once when a blocked
  partition leaves the block (passed), published by a ``resume_report`` run (never as
  run-less events, which Dagster's storage refuses twice for one asset partition: see
  :mod:`sensors.report`). A live lease of another run is not reported: its own run shows
  the check in progress. Blocks are also logged. A launch stranded past its attempts
  (docs/DESIGN.md#stranded-runs) is reported the same way on its steps, failed with the
  failure and the command, passed once the partition launches again or changes.
- an outage (the storage or the ledger out of reach, its retries spent) is no block: a
  partition whose judging meets one is deferred (nothing launched or reported for it,
  judged again next tick), and one met by the tick's own reads defers the whole tick; the
  tick's line (its log and skip reason) names the partitions and the outage.

The sensor writes nothing to the ledger or the checkpoint tree. In Dagster it marks failed a
run of this instance that only the ledger shows dead (:mod:`sensors.abandoned_runs`), so
its episode's queue opens.
"""

from collections.abc import Callable, Collection, Sequence
from datetime import UTC, datetime

import dagster as dg

from pipeline_defs.judging.blocks import CheckChange
from pipeline_defs.judging.cursor import cursor_extra, with_cursor_extra
from pipeline_defs.judging.registry import ticker_for
from pipeline_defs.judging.scan import episode_of
from pipeline_defs.judging.scrub import scrub_for
from pipeline_defs.judging.step_evaluation import LAUNCH_ACTIONS, StepEvaluation
from pipeline_defs.judging.stores import Stores
from pipeline_defs.judging.tick import InFlight
from pipeline_defs.judging.tick_result import TickConfig, TickResult
from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.errors import OutageError
from pipeline_defs.resume.status import LedgerRow, StepStatus
from pipeline_defs.steps.graph import order_steps
from pipeline_defs.steps.spec import Step
from pipeline_defs.wiring.assets import episodes, owner_ended_in
from pipeline_defs.wiring.backfills import backfills_in_progress
from pipeline_defs.wiring.stranded_runs import (
    StrandedLaunches,
    failed_since_last_tick,
    stranded_reports,
)
from resources.ledger.store import LedgerStore
from resources.pipeline import PipelineResource
from sensors.abandoned_runs import end_abandoned_runs
from sensors.report import report_requests, resume_report

SENSOR_NAME = "resume_sensor"
STEPS_JOB = "resume_steps"
DEFAULT_INTERVAL_SECONDS = 30
TAG_VALUE_LIMIT = 63
SCRUB_FIELD = "scrub"  # the scrub's round, kept in the cursor beside the tick's state
STRANDED_FIELD = "stranded"  # the stranded launches reported, ``step|partition`` → signature
LOGGED_CHANGES = 50


# Malformed keys last logged, per sensor (the code server is long-lived).
_INVALID_LOGGED: dict[str, frozenset[str]] = {}


def split_partition_keys(keys: Sequence[str]) -> tuple[list[str], frozenset[str]]:
    """Valid ``PROJECT/EPISODE`` keys, and the malformed ones (e.g. added by hand in the UI):
    those are reported once and never judged (a block per step with a ``force`` hint for a
    partition that cannot exist would only mislead)."""
    valid, invalid = [], set()
    for key in keys:
        if episode_of(key) is None:  # Episode.parse, cached per key (every tick asks)
            invalid.add(key)
        else:
            valid.append(key)
    return valid, frozenset(invalid)


def utc_now() -> datetime:
    return datetime.now(UTC)


def tag_value(text: str, limit: int = TAG_VALUE_LIMIT) -> str:
    """One line, at most ``limit`` characters (Dagster's tag-value limit)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def run_request(
    run: Sequence[StepEvaluation],
    job_name: str = STEPS_JOB,
    stranded: StrandedLaunches | None = None,
) -> dg.RunRequest:
    """One materialization of a partition's steps (dependency order), deduped by run key
    (a launch again of a stranded one: its attempt's key,
    ``pipeline_defs/wiring/stranded_runs.py``)."""
    first = run[0]
    # The run's cause: its first step launched for work of its own (a not-applicable step
    # recorded on the way is no cause).
    lead = next((ev for ev in run if ev.decision.action in LAUNCH_ACTIONS), first)
    decision = lead.decision
    return dg.RunRequest(
        run_key=stranded.key_for(first.run_key) if stranded is not None else first.run_key,
        job_name=job_name,
        asset_selection=[dg.AssetKey(ev.step_id) for ev in run],
        partition_key=first.partition_key,
        tags={
            "resume/action": decision.action.value,
            "resume/origin": decision.origin.value if decision.origin else "none",
            "resume/reason": tag_value(decision.reason),
            "resume/state": first.run_state,
            "resume/steps": str(len(run)),
        },
    )


IN_FLIGHT = (
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)


def runs_in_flight(
    instance: dg.DagsterInstance,
    steps: Collection[dg.AssetKey],
    ledger: LedgerStore | None = None,
) -> InFlight:
    """Of some partitions, those with a run of their steps not ended (any launch path: the
    sensor's, the UI's, a backfill, the CLI), with its last sign of life: when it started,
    or last changed status on its way there, or its coordinator last renewed its run lease
    (docs/DESIGN.md#run-leases: a live coordinator whose steps wait for a worker keeps its
    partition held); None while it waits in the queue (the queue starts it). One query of
    those partitions' runs not ended (and one of their run leases), only when asked."""

    def ask(partitions: Collection[str]) -> dict[str, float | None]:
        found: dict[str, float | None] = {}
        if not partitions:
            return found
        wanted = dg.RunsFilter(
            statuses=list(IN_FLIGHT), tags={"dagster/partition": sorted(partitions)}
        )
        records = list(instance.get_run_records(wanted))
        beats: dict[str, float] = {}
        if ledger is not None and records:
            leases = ledger.run_leases([r.dagster_run.run_id for r in records])
            for run_id, lease in leases.items():
                beat = parse_timestamp(lease.heartbeat_at)
                if lease.ended_at is None and beat is not None:
                    beats[run_id] = beat.timestamp()
        for record in records:
            run = record.dagster_run
            pk = run.tags.get("dagster/partition")
            selection = run.asset_selection
            if pk is None or (selection is not None and selection.isdisjoint(steps)):
                continue  # runs of other assets
            if run.status is dg.DagsterRunStatus.QUEUED:
                alive: float | None = None
            elif run.status is dg.DagsterRunStatus.STARTED and record.start_time is not None:
                alive = record.start_time
            else:  # dequeued, starting, canceling: a worker that never comes is dead too
                alive = record.update_timestamp.timestamp()
            if alive is not None and run.run_id in beats:
                alive = max(alive, beats[run.run_id])
            earlier = found.get(pk, 0.0)
            found[pk] = None if alive is None or earlier is None else max(earlier, alive)
        return found

    return ask


def dead_owner_requests(
    running: Sequence[LedgerRow],
    owner_ended: Callable[[str], str | None],
    partitions: set[str],
    launching: set[tuple[str, str]],
    job_name: str = STEPS_JOB,
    backfilled: Collection[str] = (),
) -> list[dg.RunRequest]:
    """A launch for every running row whose owner run has ended (docs/DESIGN.md#dead-owners).

    The tick judges leases by time (a lapsed heartbeat); a run that run monitoring marked
    FAILURE is dead now. The launched run's own judge sees the ended owner and takes the row
    over (an expected-match steal); the sensor only saves the wait for the lease to lapse.
    ``running``: the running rows (one query per tick; there are few). ``backfilled``: the
    partitions a backfill in progress targets: its run recovers them (none requested).
    """
    requests = []
    for row in running:
        pk = f"{row.project_id}/{row.episode_id}"
        slot = (str(row.step_id), pk)
        if pk not in partitions or slot in launching or pk in backfilled:
            continue
        ended = owner_ended(str(row.run_id))
        if ended is None:
            continue
        requests.append(
            dg.RunRequest(
                run_key=f"resume:{slot[0]}:{pk}:owner-ended:{row.run_id}",
                job_name=job_name,
                asset_selection=[dg.AssetKey(slot[0])],
                partition_key=pk,
                tags={
                    "resume/action": ResumeAction.STALE_RUNNING_RECOVERY.value,
                    "resume/origin": "none",
                    "resume/reason": tag_value(f"owner run ended ({ended})"),
                },
            )
        )
    return requests


def check_report(change: CheckChange) -> dict[str, object]:
    """``resume_integrity`` of the asset partition, as a report for the ``resume_report`` run.

    Failed for a block (origin, reason, code, what to do), passed when a block cleared.
    """
    ev = change.evaluation
    decision = ev.decision
    origin = decision.origin.value if decision.origin else "none"
    if change.passed:
        metadata = {
            "action": decision.action.value,
            "reason": decision.reason,
            "verdict": ev.verdict.value,
        }
        if ev.running_healthy:  # the judge's block word is no verdict on a live lease
            del metadata["verdict"]
            metadata["status"] = StepStatus.RUNNING.value
        description = f"no longer blocked: {_cleared_by(ev)}"
    else:
        metadata = {
            "origin": origin,
            "reason": decision.reason,
            "code": decision.code or "",
            "what_to_do": ev.what_to_do,
        }
        description = f"blocked ({decision.code}, origin {origin}): {decision.reason}"
    return {
        "step_id": ev.step_id,
        "partition": ev.partition_key,
        "passed": change.passed,
        "description": description[:1000],
        "metadata": metadata,
    }


def _cleared_by(ev: StepEvaluation) -> str:
    """What a cleared block turned into: the action, or for a step another run took up (a
    live lease, no block: docs/DESIGN.md#reports) ``running``, with its owner."""
    if ev.running_healthy:
        return f"{StepStatus.RUNNING.value} (run {ev.facts.run_id!r} holds a live lease)"
    return ev.decision.action.value


def _known_partitions(
    context: dg.SensorEvaluationContext, requests: Sequence[dg.RunRequest]
) -> None:
    """Ask Dagster once whether the requests' partitions exist, so that its resolution of
    the run requests answers from its cache: it checks each request's partition with a
    query of its own (13 ms each on a test instance: 0.40 s of a 3,000-episode 1 % tick with
    30 runs, benchmarks/sensor_tick.py). The same check, made for all at once."""
    loader = context.caching_dynamic_partitions_loader  # per evaluation; None without an instance
    keys = sorted({r.partition_key for r in requests if r.partition_key})
    if loader is not None and keys:
        loader.get_existing_dynamic_partitions(str(episodes.name), keys)


def _log(context: dg.SensorEvaluationContext, result: TickResult) -> None:
    context.log.info(result.stats.line())
    for change in result.checks[:LOGGED_CHANGES]:
        ev = change.evaluation
        if change.passed:
            context.log.info(f"unblocked {ev.step_id} [{ev.partition_key}]: {_cleared_by(ev)}")
        else:
            context.log.info(
                f"BLOCK {ev.step_id} [{ev.partition_key}] {ev.decision.code} "
                f"(origin {ev.decision.origin.value if ev.decision.origin else 'none'}): "
                f"{ev.decision.reason} — {ev.what_to_do}"
            )
    if len(result.checks) > LOGGED_CHANGES:
        context.log.info(f"... and {len(result.checks) - LOGGED_CHANGES} more block changes")
    for run in result.runs[:LOGGED_CHANGES]:
        first = run[0]
        steps = ", ".join(ev.step_id for ev in run)
        context.log.info(
            f"launch {steps} [{first.partition_key}]: {first.decision.action.value} — "
            f"{first.decision.reason}"
        )


def build_resume_sensor(
    steps: Sequence[Step],
    *,
    name: str = SENSOR_NAME,
    minimum_interval_seconds: int = DEFAULT_INTERVAL_SECONDS,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.RUNNING,
    full_refresh_seconds: float = 600.0,
    tick_budget_seconds: float = 40.0,
    workers: int | None = None,
    trust_seals: bool = True,
    clock: Callable[[], datetime] = utc_now,
    executor: dg.ExecutorDefinition | None = None,
) -> dg.SensorDefinition:
    """The resume sensor over ``steps`` (the assets of :func:`build_step_assets`).

    ``executor``: where its runs' steps execute; None, one after the other in the run's
    process. The code location passes the fleet's under ``PIPELINE_EXECUTOR=celery``.

    ``full_refresh_seconds``: re-judge everything this often; ``tick_budget_seconds``: stop
    judging after this long and continue next tick; ``workers``: judge processes for big
    batches (None: one per CPU, at most 8; 1: never); ``trust_seals``: judge clean published
    checkpoints whose files are unchanged from their seal (False: read and verify every
    envelope on each full judgement); ``clock``: for tests.
    """
    ordered = order_steps(steps)
    config = TickConfig(
        full_refresh_seconds=full_refresh_seconds,
        budget_seconds=tick_budget_seconds,
        workers=workers,
        trust_seals=trust_seals,
    )
    steps_job_name = STEPS_JOB if name == SENSOR_NAME else f"{name}_steps"
    step_keys = frozenset(dg.AssetKey(s.step_id) for s in ordered)
    steps_job = dg.define_asset_job(
        # One job per sensor: two sensors in one Definitions (e.g. with and without seals in
        # benchmarks/sensor_tick.py) must not declare the same job twice.
        steps_job_name,
        selection=[dg.AssetKey(s.step_id) for s in ordered],
        description=(
            "Runs launched by resume_sensor: per episode, the steps that need work on their "
            "own judgement, in dependency order."
        ),
        # The steps of a run one after the other in the run's process, as the CLI runs them:
        # a process per step cost more than the steps themselves (benchmarks/recovery.py C:
        # ten offline steps took 36.6 s with one process each, against 10.4 s for the CLI).
        # Episodes still run side by side, one run each. On the fleet, each step is a task.
        executor_def=executor or dg.in_process_executor,
    )

    @dg.sensor(
        name=name,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        jobs=[steps_job, resume_report],
        description=(
            "Judges every step of every episode (resume mode) and launches one run per "
            "episode holding its re-runs and stale-lease recoveries (never a step that is "
            "settled); reports blocks and their clearance as resume_integrity checks "
            "through resume_report runs."
        ),
    )
    def resume_sensor(
        context: dg.SensorEvaluationContext, pipeline: PipelineResource
    ) -> dg.SensorResult:
        if not ordered:
            return dg.SensorResult(skip_reason="no judged steps", cursor=context.cursor)
        registered = context.instance.get_dynamic_partitions(str(episodes.name))
        partition_keys, invalid = split_partition_keys(registered)
        if invalid and _INVALID_LOGGED.get(name) != invalid:  # once per change, not per tick
            context.log.warning(
                f"ignoring {len(invalid)} malformed episodes partition key(s) "
                f"(expected PROJECT/EPISODE of [A-Za-z0-9_-]): {sorted(invalid)[:10]}"
            )
        _INVALID_LOGGED[name] = invalid
        stores = Stores.of(pipeline)
        # On object storage, this tick's share of the scrub first: a seal it clears moves
        # its row, so the tick below re-judges that partition the long way.
        scrub = scrub_for(name)
        try:
            scrubbed = scrub.step(stores, partition_keys, cursor_extra(context.cursor, SCRUB_FIELD))
        except OutageError as exc:
            # No scrub this tick (its share waits for the next): the judging below still
            # defers just the partitions the outage reaches.
            context.log.warning(f"scrub: waits for {exc.code}: {exc.message}")
        else:
            for drift in scrubbed.drifts[:LOGGED_CHANGES]:
                context.log.warning(f"scrub: {drift.step}: {drift.why}; judged again")
        now = clock()
        stranded = StrandedLaunches(context.instance, stores.settings, now.timestamp())
        try:
            running = stores.ledger.running_rows()
            # A run whose claims all stopped heartbeating long ago holds its episode's queue
            # for good (a killed CLI run, a lost host): ended first, so the recovery can start.
            for abandoned in end_abandoned_runs(
                context.instance, running, stores.settings, now, stores.ledger
            ):
                context.log.warning(f"run {abandoned.run_id} marked failed: {abandoned.message}")
            ticker = ticker_for(name, ordered, stores, config)
            in_flight = runs_in_flight(context.instance, step_keys, stores.ledger)
            # One query of the backfills in progress, when the tick first asks.
            backfilling = backfills_in_progress(context.instance, step_keys)
            ticker.recheck(failed_since_last_tick(context.instance, name))
            result = ticker.tick(
                partition_keys, now, context.cursor, in_flight, stranded.holds, backfilling
            )
        except OutageError as exc:
            # Not a verdict on any partition: nothing is launched, reported or remembered
            # (the cursor stays), and the next tick judges as if this one never ran.
            why = (
                f"resume tick deferred: every partition ({len(partition_keys)}) waits for "
                f"{exc.code} ({exc.message}); judged again next tick"
            )
            context.log.warning(why)
            return dg.SensorResult(skip_reason=why, cursor=context.cursor)
        if result.changed:
            _log(context, result)
        for stuck in stranded.exhausted.values():
            context.log.warning(stuck.why)
        requests = [run_request(run, steps_job_name, stranded) for run in result.runs]
        launching = {(ev.step_id, ev.partition_key) for ev in result.launches}
        requests += dead_owner_requests(
            running,
            owner_ended_in(context.instance),
            set(partition_keys),
            launching,
            steps_job_name,
            backfilling({f"{row.project_id}/{row.episode_id}" for row in running}),
        )
        # A live lease is no fault (the owner's run shows the check in progress itself): no
        # change is a failed check for one, only the clearance of a block published before.
        reports = [check_report(c) for c in result.checks]
        # A launch stranded past its attempts shows where blocks show, on its steps.
        seen = cursor_extra(context.cursor, STRANDED_FIELD)
        stranded_checks, still_stranded = stranded_reports(
            {str(k): str(v) for k, v in seen.items()} if isinstance(seen, dict) else None,
            stranded.exhausted,
            judged=result.judged,
            partitions=set(partition_keys),
            launched={ev.partition_key for ev in result.launches},
            blocked={c.evaluation.slot for c in result.checks if not c.passed},
        )
        reports += stranded_checks
        requests += report_requests(reports, context.cursor)
        _known_partitions(context, requests)
        # The scrub's place in its round rides in the cursor: a restarted code server goes on.
        cursor = with_cursor_extra(result.cursor, SCRUB_FIELD, scrub.state())
        cursor = with_cursor_extra(cursor, STRANDED_FIELD, still_stranded)
        if requests:
            return dg.SensorResult(run_requests=requests, cursor=cursor)
        return dg.SensorResult(cursor=cursor, skip_reason=result.stats.line())

    return resume_sensor
