"""The single judge: one pure function maps a step's observed state to a resume action.

This module holds the table (``decide`` and its rows); the words it reads and says
(``ResumeAction``, ``ResumeDecision``, ``LaunchMode``, ``CheckpointSummary``, ``ScopedConfig``,
``InTheWay``, the block codes) are :mod:`pipeline_defs.resume.decision_types`'.

UI launches, sensor ticks, backfills and scripts all call ``decide`` with the same inputs
and so reach the same decision (docs/DESIGN.md#decision-table). ``decide`` does no I/O and
reads no clock: the caller passes ``now`` and a lazy ``verify`` that is only run when the table
needs it (verification can be expensive).
"""

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from pipeline_defs.resume.budget import CODE_BUDGET_EXHAUSTED, Budget
from pipeline_defs.resume.clock import (
    MAX_CLOCK_SKEW,
    as_utc,
    beyond_clock_skew,
    format_timestamp,
    parse_timestamp,
)
from pipeline_defs.resume.completion import CompletionReport, Origin, report_from_exception
from pipeline_defs.resume.decision_types import (
    CLAIMING_ACTIONS,
    CODE_ALREADY_RUNNING,
    CODE_RECOVERY_EXHAUSTED,
    CODE_RESUME_BLOCKED,
    CODE_VERIFY_CRASHED,
    FIRST_RUN_REASON,
    FORCE_HINT,
    CheckpointSummary,
    InTheWay,
    JudgedStep,
    LaunchMode,
    ResumeAction,
    ResumeDecision,
    ScopedConfig,
    config_hash,
)
from pipeline_defs.resume.errors import OutageError, PipelineError, SymlinkRefused
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow, StepStatus

MAX_LISTED_MISSING = 5


# The commonest verdict by far (a sensor tick judges every settled step): built once.
_CLEAN_SKIP = ResumeDecision(ResumeAction.SKIP, "completed and verified clean", origin=Origin.CLEAN)


def _rerun(reason: str, origin: Origin | None = None) -> ResumeDecision:
    return ResumeDecision(ResumeAction.RERUN_SELF, reason, origin=origin, auto_recovery=True)


def _block(reason: str, origin: Origin | None, code: str = CODE_RESUME_BLOCKED) -> ResumeDecision:
    return ResumeDecision(ResumeAction.BLOCK, reason, origin=origin, code=code)


def _summarize(items: tuple[str, ...]) -> str:
    listed = ", ".join(items[:MAX_LISTED_MISSING])
    extra = len(items) - MAX_LISTED_MISSING
    return f"{listed} (and {extra} more)" if extra > 0 else listed


def _changed_keys(saved: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    keys = set(saved) | set(current)
    return sorted(k for k in keys if saved.get(k) != current.get(k))


def _run_verify(verify: Callable[[], CompletionReport]) -> CompletionReport:
    try:
        report = verify()
    except Exception as exc:  # the verifier's failure is itself a verdict ...
        if isinstance(exc, OutageError):  # ... an outage is none (docs/DESIGN.md#stranded-runs)
            raise
        return report_from_exception(exc)
    if not isinstance(report, CompletionReport):
        return report_from_exception(
            TypeError(f"verify_completion returned {type(report).__name__}, not CompletionReport")
        )
    return report


def _judge_running(
    row: LedgerRow, settings: ResumeSettings, now: datetime, owner_ended: str | None
) -> ResumeDecision:
    """Rows 5, 6 and 6b: another run holds the step; only a lapsed lease may be stolen.

    A row with a heartbeat is stale when the heartbeat is older than ``lease_seconds``
    (docs/DESIGN.md#settings); a row without one when it started ``running_timeout_seconds`` ago.
    """
    raw_started = row.started_at
    run_id = row.run_id
    started = parse_timestamp(raw_started)
    if started is None:
        return _block(
            f"ledger row is running but started_at {raw_started!r} is missing or unparseable "
            f"(owner run {run_id!r}); manual investigation required",
            None,
        )
    # Row 5 too: a started_at far in the future never times out, so it would count as a
    # healthy lease forever. It is as untrustworthy as an unparseable one.
    if beyond_clock_skew(started, now):
        ahead = (started - now).total_seconds()
        return _block(
            f"ledger row is running but started_at {raw_started!r} is {ahead:.0f}s in the "
            f"future, beyond the {MAX_CLOCK_SKEW.total_seconds():.0f}s allowed clock skew "
            f"(owner run {run_id!r}); manual investigation required",
            None,
        )
    raw_beat = row.heartbeat_at
    if owner_ended:  # whatever the heartbeat says, nobody renews it any more
        return ResumeDecision(
            ResumeAction.STALE_RUNNING_RECOVERY,
            f"owner run {run_id!r} has ended ({owner_ended}) while its ledger row is still "
            "running; recovering the dead lease",
            expected_started_at=raw_started,
            expected_run_id=run_id,
            expected_heartbeat_at=raw_beat,
            auto_recovery=True,
        )
    beat = parse_timestamp(raw_beat)
    # Row 5 for the heartbeat: one from beyond the allowed clock skew ahead
    # has a negative age that never reaches the lease, so the row would count as healthy
    # forever. The allowance is the started_at one: the owner's host writes both from the
    # same clock (a claim writes them equal). An ended owner was recovered above: nobody
    # renews its heartbeat, whatever its text says.
    if beat is not None and beyond_clock_skew(beat, now):
        ahead = (beat - now).total_seconds()
        return _block(
            f"ledger row is running but heartbeat_at {raw_beat!r} is {ahead:.0f}s in the "
            f"future, beyond the {MAX_CLOCK_SKEW.total_seconds():.0f}s allowed clock skew "
            f"(owner run {run_id!r}); manual investigation required",
            None,
        )
    if beat is not None:  # a renewed lease: its age decides, however long the step runs
        age = (now - beat).total_seconds()
        if age < settings.lease_seconds:
            return _block(
                f"running healthy: owned by run {run_id!r}, last heartbeat {max(age, 0):.0f}s "
                f"ago (lease {settings.lease_seconds:g}s)",
                None,
                CODE_ALREADY_RUNNING,
            )
        return ResumeDecision(
            ResumeAction.STALE_RUNNING_RECOVERY,
            f"run {run_id!r} last renewed its lease {age:.0f}s ago, at or past the "
            f"{settings.lease_seconds:g}s lease; recovering the expired lease",
            expected_started_at=raw_started,
            expected_run_id=run_id,
            expected_heartbeat_at=raw_beat,
            auto_recovery=True,
        )
    # No (readable) heartbeat: a row written before leases; the running timeout applies.
    elapsed = now - started
    timeout = timedelta(seconds=settings.running_timeout_seconds)
    if elapsed < timeout:
        return _block(
            f"running healthy: owned by run {run_id!r}, started {elapsed.total_seconds():.0f}s ago "
            f"(timeout {settings.running_timeout_seconds}s)",
            None,
            CODE_ALREADY_RUNNING,
        )
    return ResumeDecision(
        ResumeAction.STALE_RUNNING_RECOVERY,
        f"run {run_id!r} has been running for {elapsed.total_seconds():.0f}s, at or past the "
        f"{settings.running_timeout_seconds}s timeout; recovering the expired lease",
        expected_started_at=raw_started,
        expected_run_id=run_id,
        auto_recovery=True,
    )


def _judge_settled(
    status: StepStatus | str,
    checkpoint: CheckpointSummary,
    verify: Callable[[], CompletionReport],
    step: JudgedStep,
    config: ScopedConfig,
) -> ResumeDecision:
    """Rows 8-11 for a present checkpoint and a non-running status."""
    # Row 11 does not apply to an unusable checkpoint: re-running a failed or
    # partial row would write over the evidence of the tampering as silently as a completed
    # row must not; it is judged as on a completed row (row 10 reports how it is broken).
    recover = status is not StepStatus.COMPLETED and not checkpoint.unusable
    if recover and status is StepStatus.STALE:
        # The ledger's "stale" is a row an explicit force upstream invalidated; "stale"
        # for a running row means a lapsed lease. Operators read one word for each.
        return _rerun("auto recovery: invalidated by an explicit force upstream")
    if recover:
        return _rerun(f"auto recovery from {status}")
    # Row 8: the stored shape is not the shape this code reads.
    if checkpoint.schema_version != step.schema_version:
        versions = (
            f"checkpoint schema_version {checkpoint.schema_version} differs from the step's "
            f"schema_version {step.schema_version}"
        )
        if step.allow_auto_rerun_on_schema_bump:
            return _rerun(
                f"{versions}; the step allows an automatic rerun on a schema bump",
                Origin.CONTRACT_DRIFT,
            )
        return _block(f"{versions}; {FORCE_HINT}", Origin.CONTRACT_DRIFT)
    # Row 9: the output was produced under a different scoped config.
    saved_hash = checkpoint.config_hash
    if saved_hash is None:  # an envelope without a hash: judge by its fingerprints
        saved_hash = config_hash(checkpoint.config_fingerprints)
    if saved_hash != config.hash:
        changed = (
            _changed_keys(checkpoint.config_fingerprints, config.fingerprints)
            if checkpoint.config_fingerprints
            else []
        )
        if changed:
            what = f"scoped config changed for keys: {', '.join(changed)}"
        else:
            keys = ", ".join(step.resume_config_keys) or "(none)"
            what = f"scoped config hash changed (resume_config_keys: {keys})"
        return _block(f"{what}; {FORCE_HINT}", Origin.CONTRACT_DRIFT)
    # Row 10: only now is the (possibly expensive) verifier worth running.
    report = _run_verify(verify)
    origin = report.origin or Origin.CLEAN
    error = report.metadata.get("error")
    detail = f" ({error})" if error else ""
    if origin is Origin.CLEAN:
        return _CLEAN_SKIP
    if origin is Origin.ARTIFACT_MISSING:
        missing = _summarize(report.missing) or "unspecified artifacts"
        return _rerun(f"completed but artifacts are missing: {missing}", origin)
    if origin is Origin.INPUT_CHANGED:  # made from an input that changed since: made again
        inputs = _summarize(report.missing) or "an input changed"
        return _rerun(f"completed, but its input changed since: {inputs}", origin)
    if origin is Origin.VICTIM_CHANGED:  # a mutator's edits no longer held: review again
        victims = _summarize(report.missing) or "a victim changed"
        return _rerun(f"completed, but its edits no longer hold in: {victims}", origin)
    if origin is Origin.VERIFY_CRASHED:
        return _block(f"verify_completion crashed{detail}", origin, CODE_VERIFY_CRASHED)
    found = f": {_summarize(report.missing)}" if report.missing else ""
    return _block(f"verification found {origin.value}{found}{detail}; {FORCE_HINT}", origin)


def _apply_limits(
    decision: ResumeDecision,
    row: LedgerRow | None,
    settings: ResumeSettings,
    now: datetime,
) -> ResumeDecision:
    """Rows 12 and 13: cap automatic recoveries, and defer them during backoff."""
    if not decision.auto_recovery or row is None:
        return decision
    count = row.recovery_count
    if count >= settings.max_recovery_attempts:
        return _block(
            f"recovery exhausted after {count} automatic recoveries "
            f"(max_recovery_attempts={settings.max_recovery_attempts}); last recovery reason: "
            f"{row.last_recovery_reason!r}; would have done {decision.action.value}: "
            f"{decision.reason}",
            decision.origin,
            CODE_RECOVERY_EXHAUSTED,
        )
    raw_retry = row.retry_not_before
    retry_at = parse_timestamp(raw_retry)
    if retry_at is not None and retry_at > now:
        text = raw_retry if isinstance(raw_retry, str) else format_timestamp(retry_at)
        return replace(decision, deferred_until=text)
    return decision


def _apply_budget(decision: ResumeDecision, budget: Budget | None) -> ResumeDecision:
    """Row 14: a claim in an episode at its spend cap is blocked (docs/DESIGN.md#spend-cap).

    Every claiming verdict may pay (a force too: blocked before its cleanup, not after);
    the episode's recorded calls are read only here, when the verdict claims.
    """
    if budget is None or not decision.claims:
        return decision
    cap, spent = budget.cap(), budget.spent()
    if spent < cap.limit:
        return decision
    return _block(
        f"{cap.exhausted(budget.project_id, budget.episode_id, spent)}; would have "
        f"done {decision.label}: {decision.reason}",
        decision.origin,
        CODE_BUDGET_EXHAUSTED,
    )


def _by_table(
    *,
    mode: LaunchMode,
    applicable: bool,
    row: LedgerRow | None,
    checkpoint: CheckpointSummary,
    verify: Callable[[], CompletionReport],
    step: JudgedStep,
    config: ScopedConfig,
    settings: ResumeSettings,
    now: datetime,
    owner_ended: str | None = None,
) -> ResumeDecision:
    """The decision table's rows 1-13 (first match wins); :func:`decide` adds what is in the
    way and the budget (row 14) to what they return."""
    now = as_utc(now)
    # Row 1.
    if not applicable:
        return ResumeDecision(
            ResumeAction.NOT_APPLICABLE, "step is not applicable to this partition"
        )
    # Row 2.
    if LaunchMode(mode) is LaunchMode.FORCE:
        return ResumeDecision(ResumeAction.FORCE_EXPLICIT, "explicit force requested")
    if LaunchMode(mode) is LaunchMode.REDRAW:
        # Row 2b: a scoped-config drift or a live owner must not be redrawn over (one new
        # picture under another config would publish a mixed checkpoint): those stand.
        judged = _by_table(
            mode=LaunchMode.RESUME,
            applicable=applicable,
            row=row,
            checkpoint=checkpoint,
            verify=verify,
            step=step,
            config=config,
            settings=settings,
            now=now,
            owner_ended=owner_ended,
        )
        if judged.action not in (ResumeAction.SKIP, ResumeAction.RERUN_SELF):
            return judged
        return ResumeDecision(
            ResumeAction.REDRAW_EXPLICIT, f"explicit redraw requested (resume: {judged.reason})"
        )
    if row is None:
        # Row 3.
        if not checkpoint.present:
            return ResumeDecision(ResumeAction.RERUN_SELF, FIRST_RUN_REASON, first_run=True)
        # Row 4: judge the orphan checkpoint by its own status; a clean one is adopted.
        status: StepStatus | str = (
            checkpoint.status if checkpoint.status is not None else StepStatus.COMPLETED
        )
        decision = _judge_settled(status, checkpoint, verify, step, config)
        if decision.action is ResumeAction.SKIP:
            decision = replace(
                decision,
                adopt=True,
                reason="no ledger row; adopts the verified checkpoint as a completed row",
            )
    else:
        status = row.status
        if status is StepStatus.RUNNING:
            decision = _judge_running(row, settings, now, owner_ended)  # rows 5, 6, 6b
        elif status is StepStatus.COMPLETED and not checkpoint.present:
            decision = _rerun(  # row 7
                "ledger says completed but the checkpoint is absent", Origin.ARTIFACT_MISSING
            )
        else:
            decision = _judge_settled(status, checkpoint, verify, step, config)  # rows 8-11
    return _apply_limits(decision, row, settings, now)


def decide(
    *,
    mode: LaunchMode,
    applicable: bool,
    row: LedgerRow | None,
    checkpoint: CheckpointSummary,
    verify: Callable[[], CompletionReport],
    step: JudgedStep,
    config: ScopedConfig,
    settings: ResumeSettings,
    now: datetime,
    owner_ended: str | None = None,
    in_the_way: InTheWay | None = None,
    budget: Budget | None = None,
) -> ResumeDecision:
    """Apply docs/DESIGN.md#decision-table (first match wins). Pure: no I/O, no writes, no clock.

    ``owner_ended``: for a running row, the terminal state (e.g. ``FAILURE``) of the Dagster
    run owning it, if known to have ended: its lease is dead at once (docs/DESIGN.md#dead-owners).

    ``verify`` is called at most once, and only for a completed step whose contract and
    scoped config still match (row 10, also reached through row 4).

    ``in_the_way``: what stands where a claiming run would write (:class:`InTheWay`): a
    decision that would claim is a block instead, before any claim, cleanup or model call.

    ``budget``: the episode's spend cap and its recorded calls (row 14); each is asked at
    most once, and only for a claiming verdict.
    """
    decision = _by_table(
        mode=mode,
        applicable=applicable,
        row=row,
        checkpoint=checkpoint,
        verify=verify,
        step=step,
        config=config,
        settings=settings,
        now=now,
        owner_ended=owner_ended,
    )
    return _apply_budget(_in_the_way(decision, in_the_way), budget)


def _in_the_way(decision: ResumeDecision, in_the_way: InTheWay | None) -> ResumeDecision:
    if in_the_way is None:
        return decision
    unreadable = in_the_way.unreadable
    if unreadable is None and decision.action in CLAIMING_ACTIONS and in_the_way.probe:
        found = in_the_way.probe(decision.action, decision.auto_recovery)
        if found is not None:
            # Not a regular file: the verifier calls it "missing" and a re-run (or a force)
            # would pay for the item, then fail to move it into place. An older copy: a
            # re-run would adopt it silently. A link: written through. Blocked before any.
            origin = Origin.CONTRACT_DRIFT if isinstance(found, SymlinkRefused) else found.origin
            return _blocked_by(found, origin)
    if (
        unreadable is not None
        and isinstance(unreadable, SymlinkRefused)
        and decision.action is not ResumeAction.BLOCK
    ):
        # The table reaches the verifier (which reports the link) only for some rows; a
        # failed or stale row would be re-run, i.e. written through or over the link.
        return _blocked_by(unreadable, Origin.CONTRACT_DRIFT)
    return decision


def _blocked_by(error: PipelineError, origin: str | None) -> ResumeDecision:
    return ResumeDecision(
        ResumeAction.BLOCK,
        error.message,
        origin=Origin(origin or Origin.CONTRACT_DRIFT),
        code=CODE_RESUME_BLOCKED,
    )
