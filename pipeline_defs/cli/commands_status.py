"""``storyboard status``: per partition and step, then the queue, the leases, the last hour,
the settings in force and where checkpoints are published."""

import math
from collections.abc import Mapping, Sequence
from typing import Any

import click

from pipeline_defs.cli.app import checked_workspace, main, report_invalid_partitions
from pipeline_defs.cli.options import partitions_filter
from pipeline_defs.cli.render import (
    SaidOnce,
    advice,
    age,
    listed,
    packed,
    seconds,
    table_lines,
    terminal_width,
    wrap,
)
from pipeline_defs.cli.shared import operation
from pipeline_defs.operations.operator_words import shown_status
from pipeline_defs.operations.status_report import StepState, status_report
from pipeline_defs.operations.status_spend import SpendFigures, SpendReport
from pipeline_defs.operations.status_summary import QueueHolder, StatusSummary, UnservedQueue
from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.fleet_settings import worker_command
from pipeline_defs.resume.money import money_text
from pipeline_defs.resume.settings import EffectiveSettings, format_value
from pipeline_defs.steps.lease import abandoned_after_seconds


@main.command()
@partitions_filter
@operation("status")
def status(*, partitions: tuple[str, ...], as_json: bool) -> dict[str, Any] | None:
    """Per partition and step: state, what the sensor does now, blocks, costs, durations;
    then the queue, the leases, exhausted recoveries, the last hour and the settings in force.

    "now" and the blocks are the judgement `storyboard decide` and the resume sensor make;
    "last decision" is the last one a run recorded.
    """
    ws = checked_workspace()
    report = status_report(ws, partitions)
    invalid = report_invalid_partitions(ws)
    storage = _storage_line(ws)
    if as_json:
        settings = ws.effective_settings.rows()
        return {
            **report.as_dict(),
            "invalid_partitions": invalid,
            "settings": settings,
            "storage": storage,
        }
    width = terminal_width()
    # One write for the table (a reader that stops early, e.g. ``head``, cuts it short).
    click.echo("\n".join(_status_table(report.steps, width)) if report.steps else "no partitions")
    lines = ["", *packed("", _totals_items(report.totals), width)]
    lines += _spend_lines(report.spend)
    lines += _worker_lines(report.steps, width)
    lines += _summary_lines(
        report.summary, width, ws.settings.lease_seconds, ws.settings.heartbeat_seconds
    )
    p95 = [f"{k} {seconds(v)}" for k, v in report.p95_claimed_seconds.items() if v]
    lines += packed("claimed p95 per step:", listed(p95) or ["-"], width)
    lines += packed("settings in force:", _settings_items(ws.effective_settings), width)
    lines += wrap(storage, width) or [storage]
    click.echo("\n".join(lines))
    return {}


def _status_table(steps: Sequence[StepState], width: int) -> list[str]:
    """One line per step at 120 columns for the usual states; a block's reason and what to
    do follow its row (as in ``decide``), so nothing about a step is printed twice.

    Backoff shows as the time left in "sensor now" (``deferred 25s``; the timestamp is in
    ``--json``), and a step another run holds a live lease on as ``running``: the sensor
    leaves it to its owner, which is no block.
    """
    said = SaidOnce()
    rows = []
    firsts = []
    for s in steps:
        block = f"{s.block_origin}: {s.block_reason}" if s.block_origin else s.block_reason
        first = said.earlier(f"{s.partition} {s.step}", block, s.what_to_do)
        firsts.append(first)
        rows.append(
            (
                s.partition,
                s.step,
                shown_status(s.status),
                _sensor_now(s),
                s.last_decision,
                s.recovery_count,
                s.provider_calls,
                seconds(s.last_run_step_seconds) or "-",
                seconds(s.last_claimed_seconds) or "-",
                f"same as {first} (above)" if first else block,
            )
        )
    headers = ["partition", "step", "status", "sensor now", "last decision", "recov"]
    headers += ["calls total", "run step", "claimed", "block"]
    lines, groups = table_lines(headers, rows, width)
    for s, group, first in zip(steps, groups, firsts, strict=True):
        lines += group
        if s.what_to_do and first is None:
            advice(lines, s.what_to_do, width)
    return lines


def _spent(figures: SpendFigures, today: bool) -> str:
    calls = figures.calls_today if today else figures.calls_total
    micros = figures.cost_today_micros if today else figures.cost_total_micros
    return f"{calls} call{'s' if calls != 1 else ''} {money_text(micros)}"


def _spend_lines(spend: SpendReport) -> list[str]:
    """Per project, then per episode that recorded a call: today (UTC) and in all, in calls
    and money; spent/limit beside the money budget it counts against (the project's day, the
    episode's whole)."""
    lines = [f"spend, today ({spend.day} UTC) and in all:"]
    for project in spend.projects:
        f = project.figures
        today = _spent(f, True)
        if f.budget_micros is not None:
            today += f" of {money_text(f.budget_micros)} (max_cost_per_project_per_day)"
        lines.append(f"  project {project.project}: today {today}; in all {_spent(f, False)}")
    for episode in spend.episodes:
        f = episode.figures
        if not f.calls_total and f.budget_micros is None:
            continue
        total = _spent(f, False)
        if f.budget_micros is not None:
            total += f" of {money_text(f.budget_micros)} (max_cost_per_episode)"
        lines.append(f"  {episode.partition}: today {_spent(f, True)}; in all {total}")
    return lines if len(lines) > 1 else []


def _worker_lines(steps: Sequence[StepState], width: int) -> list[str]:
    """Who ran each step's latest claim, in the words of its history line and ``--json``'s
    ``worker`` (a fleet worker as started, then its pool child): ``workers: W ran: P s1,
    s2;  W2 ran: ...``, wrapped between steps only."""
    ran: dict[str, dict[str, list[str]]] = {}
    for s in steps:
        if s.worker:
            ran.setdefault(s.worker, {}).setdefault(s.partition, []).append(s.step)
    items: list[str] = []
    for worker, partitions in ran.items():
        items.append(f"{worker} ran:")
        for partition, step_ids in partitions.items():
            items += [f"{partition} {step_ids[0]},", *(f"{step}," for step in step_ids[1:])]
        items[-1] = items[-1].removesuffix(",") + ";"
    if not items:
        return []
    items[-1] = items[-1].removesuffix(";")
    return packed("workers:", items, width)


def _sensor_now(state: StepState) -> str | None:
    if state.running_healthy and state.rate_wait_seconds is not None:
        return f"rate limit, {math.ceil(state.rate_wait_seconds)}s"
    if state.running_healthy:
        return "running"
    if state.verdict == "deferred" and state.retry_in_seconds is not None:
        return f"deferred {age(state.retry_in_seconds)}"
    return state.verdict


def _totals_items(t: Mapping[str, Any]) -> list[str]:
    calls = f"provider calls total {t['provider_calls']}"
    if t["unknown_outcome_calls"]:
        calls += f" ({t['unknown_outcome_calls']} of unknown outcome: sent by a worker that died)"
    return [
        f"running {t['running']}",
        f"blocked {t['blocked']}",
        f"failed {t['failed']}",
        f"partial {t['partial']}",
        f"pending {t['pending']}",
        f"never run {t['never_run']}",
        calls,
    ]


# How many exhausted steps are named on their line; the table names every one.
_NAMED_EXHAUSTED = 3


def _holder_line(holder: QueueHolder, lease_seconds: float, heartbeat_seconds: float) -> str:
    """Who holds a partition's run queue, and what the ledger says of its worker."""
    behind = f"{holder.queued_behind} run{'s' if holder.queued_behind != 1 else ''}"
    line = (
        f"  {holder.partition}: run {holder.run_id} ({holder.status}) holds the queue, "
        f"{behind} waiting behind it"
    )
    silent = holder.claims_silent_seconds
    if holder.claims == 0:
        return line + "; it holds no ledger claim: if no step of it runs, end it (Terminate)"
    if silent is not None and silent > lease_seconds:
        limit = abandoned_after_seconds(lease_seconds, heartbeat_seconds)
        return line + (
            f"; its claims stopped heartbeating {age(silent)} ago: the resume sensor marks it "
            f"failed once silent {age(limit)}"
        )
    return line + "; its claims heartbeat: it is working"


def _unserved_line(unserved: UnservedQueue) -> str:
    partition = f" ({unserved.partition})" if unserved.partition else ""
    return (
        f"  run {unserved.run_id}{partition}: a step waits on Celery queue '{unserved.queue}', "
        f"which no worker consumes: start one with `{worker_command(unserved.queue)}`"
    )


def _summary_lines(
    summary: StatusSummary, width: int, lease_seconds: float, heartbeat_seconds: float
) -> list[str]:
    """The queue, the leases, what waits for an operator and the last hour, a line each."""
    q, leases, hour = summary.queue, summary.leases, summary.last_hour
    queued = "-" if q.queued_runs is None else str(q.queued_runs)
    if q.oldest_queued_run_age_seconds is not None:
        queued += f" (oldest {age(q.oldest_queued_run_age_seconds)})"
    lines = packed(
        "queue:",
        [
            f"launch now {q.launch}",
            f"waiting {q.waiting}",
            f"deferred {q.deferred}",
            f"oldest wait {age(q.oldest_wait_seconds)}",
            f"queued runs {queued}",
        ],
        width,
    )
    lines += [_holder_line(h, lease_seconds, heartbeat_seconds) for h in q.held_by or ()]
    lines += [_unserved_line(u) for u in q.unserved_queues or ()]
    lines += packed(
        "leases:",
        [
            f"live {leases.live}",
            f"expired, not yet reclaimed {leases.expired_not_reclaimed}",
            f"in backoff {leases.in_backoff}",
        ],
        width,
    )
    exhausted = [f"{p} {s}" for p, s in summary.recovery_exhausted]
    named = exhausted[:_NAMED_EXHAUSTED]
    if len(exhausted) > len(named):
        named.append(f"and {len(exhausted) - len(named)} more")
    label = f"recoveries exhausted {len(exhausted)}" + (":" if named else "")
    lines += packed(label, listed(named), width)
    failed = f"failed {hour.failed}" + (":" if hour.failure_codes else "")
    codes = listed([f"{code} {n}" for code, n in hour.failure_codes])
    lines += packed(
        "last hour:",
        [
            f"completed {hour.completed}",
            f"partial {hour.partial}",
            f"claimed p95 {seconds(hour.p95_claimed_seconds) or '-'}",
            f"claimed max {seconds(hour.max_claimed_seconds) or '-'}",
            failed,
            *codes,
        ],
        width,
    )
    return lines


def _settings_items(effective: EffectiveSettings) -> list[str]:
    return [f"{r['key']}={format_value(r['value'])} ({r['source']})" for r in effective.rows()]


def _storage_line(ws: Workspace) -> str:
    """Where checkpoints are published, and what that means for a second machine."""
    where = ws.pipeline.location()
    if where.storage_url is None:
        return f"checkpoints: files under {where.home} (one shared directory for every worker)"
    line = (
        f"checkpoints: published to {ws.checkpoints.location}; "
        f"{where.home} holds inputs and scratch"
    )
    if where.ledger_url.startswith("sqlite"):
        line += (
            "; the ledger is SQLite: this serves one machine only "
            "(PIPELINE_DB_URL=postgresql+psycopg://… for several)"
        )
    return line
