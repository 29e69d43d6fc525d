"""What the resume sensor would do now (``storyboard decide``), judged exactly as the sensor
judges: its batch evaluator and its dead-owner rule. Writes nothing.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pipeline_defs.operations.operator_words import FIRST_RUN, utc_now
from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.partition import Episode

if TYPE_CHECKING:  # at run time it stays imported where judged (evaluate_now), as it was
    from pipeline_defs.judging.step_evaluation import StepEvaluation
    from pipeline_defs.wiring.stranded_runs import Exhausted


def judge_now(
    ws: Workspace, episodes: Sequence[Episode], now: datetime, *, stranded: bool = False
) -> list[dict[str, Any]]:
    """What the resume sensor would do now, per partition and step. Writes nothing.

    The sensor's own batch evaluator (``pipeline_defs.judging.evaluation``): one ledger
    query, the judge in resume mode, launches only RERUN_SELF / STALE_RUNNING_RECOVERY whose
    upstream is settled, honoring backoff and recovery exhaustion. ``status`` and ``decide``
    both read it, so they cannot disagree with each other or with the sensor. ``stranded``:
    also ask the instance which launches the sensor holds: those a backfill in progress
    targets (:func:`backfilled_launches`) and those every attempt of which failed before
    changing anything (:func:`stranded_launches`).
    """
    ended = owner_ended_rule(ws)
    evaluations = evaluate_now(ws, episodes, now)
    held = stranded_launches(ws, evaluations, now) if stranded else {}
    filled = backfilled_launches(ws, evaluations) if stranded else {}
    return [
        judged_item(ev, ended, held.get(ev.partition_key), filled.get(ev.partition_key))
        for ev in evaluations
    ]


def backfilled_launches(ws: Workspace, evaluations: Sequence["StepEvaluation"]) -> dict[str, str]:
    """The sensor's backfill hold (docs/DESIGN.md#sensor) on this workspace's instance: of the
    partitions with launches, those a backfill in progress targets → its id. One query of the
    instance's backfills; {} without an instance."""
    partitions = {ev.partition_key for ev in evaluations if ev.launch}
    instance = ws.instance(required=False) if partitions else None
    if instance is None:
        return {}
    import dagster as dg

    from pipeline_defs.wiring.backfills import backfills_in_progress

    steps = [dg.AssetKey(s.step_id) for s in ws.steps]
    return dict(backfills_in_progress(instance, steps)(partitions))


# ``decide`` asks the instance about the launches of up to this many partitions (one query
# of their runs each); beyond it the stranded ones show only in the sensor's checks.
STRANDED_BY_CLI = 50


def stranded_launches(
    ws: Workspace, evaluations: Sequence["StepEvaluation"], now: datetime
) -> dict[str, "Exhausted"]:
    """The sensor's rule for launches stranded past their attempts (docs/DESIGN.md#stranded-runs)
    on this workspace's instance, by partition: {} without an instance, or when more than
    ``STRANDED_BY_CLI`` partitions would launch."""
    launches = [ev for ev in evaluations if ev.launch]
    instance = ws.instance(required=False) if launches else None
    if instance is None or len({ev.partition_key for ev in launches}) > STRANDED_BY_CLI:
        return {}
    from pipeline_defs.wiring.stranded_runs import StrandedLaunches

    rule = StrandedLaunches(instance, ws.settings, now.timestamp())
    rule.holds(launches)
    return rule.exhausted


def owner_ended_rule(ws: Workspace) -> Callable[[str], str | None] | None:
    """The sensor's dead-owner rule (``owner_ended_in``) on this workspace's instance."""
    from pipeline_defs.wiring.assets import owner_ended_in

    instance = ws.instance(required=False)
    return None if instance is None else owner_ended_in(instance)


# On object storage, ``decide``/``status`` of up to this many episodes compare them with
# the storage first (two LISTs each); beyond it they trust seals as the sensor does, whose
# scrub covers every episode once per ``scrub_period_seconds``.
SCRUBBED_BY_CLI = 50


def evaluate_now(
    ws: Workspace, episodes: Sequence[Episode], now: datetime
) -> list["StepEvaluation"]:
    from pipeline_defs.judging.evaluation import evaluate_partitions
    from pipeline_defs.judging.scrub import scrub_episodes
    from pipeline_defs.judging.stores import Stores

    stores = Stores(ws.settings, ws.ledger, ws.checkpoints)
    if len(episodes) <= SCRUBBED_BY_CLI:
        scrub_episodes(stores, episodes, clear=False)  # this process judges drift the long way
    return evaluate_partitions(ws.steps, stores, [e.partition_key for e in episodes], now)


def judged_item(
    ev: "StepEvaluation",
    owner_ended: Callable[[str], str | None] | None = None,
    stranded: "Exhausted | None" = None,
    backfill: str | None = None,
) -> dict[str, Any]:
    item = ev.as_dict()
    if backfill is not None and ev.launch:
        # The backfill launches this partition's run itself: the sensor requests nothing of
        # it until the backfill has ended, then launches what it left undone.
        item["what_to_do"] = (
            f"held: backfill {backfill} targets it; the sensor launches what it leaves "
            "undone once it has ended"
        )
    elif stranded is not None and ev.launch and ev.step_id in stranded.steps:
        # The sensor holds this launch until something changes (and reports it as a failed
        # resume_integrity check): say so, and what launches it now.
        item["what_to_do"] = (
            f"held: {stranded.failure}; launched again once something changes, or now "
            f"with: {stranded.command}"
        )
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
    from pipeline_defs.judging.step_evaluation import BLOCKED_UPSTREAM, Verdict

    if ev.verdict is Verdict.WAITING and ev.detail.startswith(BLOCKED_UPSTREAM):
        # Held by a block upstream: that comes first, its own reason after it.
        item["reason"] = f"{ev.detail}; then: {item['reason']}"
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
    return judge_now(ws, episodes, now, stranded=True)


def _sensor_episodes(ws: Workspace) -> list[Episode]:
    """The sensor evaluates registered partitions; without an instance, every known one."""
    registered = ws.registered_episodes()
    if registered is None:
        return ws.known_episodes()
    return sorted(registered)
