"""Runs left STARTED for ever: ended on the ledger's evidence, so their episode's queue opens.

A run whose coordinator vanished (a ``storyboard materialize`` killed with ``kill -9``, a
run worker's pod or host lost under a run launcher that cannot check its workers) stays
STARTED in Dagster: run monitoring never ends it there. With the shipped run queue (one run
per ``dagster/partition``) every later run of its episode then waits behind it for good.

The ledger knows better (docs/DESIGN.md#run-leases, #dead-owners). Every coordinator holds
a run lease (``run_lease``), renewed every heartbeat while it hands the run's steps out.
:func:`end_abandoned_runs` (called by the resume sensor every tick) marks a run of this
instance failed, naming the evidence, when:

- its run lease stopped being renewed: silent past :func:`abandoned_after_seconds` (a lease
  plus a heartbeat interval), whatever ledger rows the run holds or does not hold (its
  steps may have finished on workers after the coordinator died);
- or, for a run without a run lease (started before leases, or by a coordinator that could
  not reach the ledger), every running ledger row it owns lapsed the same way and it holds
  no live claim.

A run whose run lease is fresh is never ended, however long its steps wait for a worker in
a queue, and whatever its claims look like. A run this instance does not know (another
deployment's) is never touched: its heartbeats alone decide. A killed coordinator then costs
at most one lease plus two sensor intervals plus the dequeue interval before its episode
runs again. The only write is closing the lease of a run found ended.
"""

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import dagster as dg

from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.steps.lease import abandoned_after_seconds, coordinator_alive, silence
from pipeline_defs.wiring.assets import ENDED_RUN_STATUSES, owner_run_id
from resources.ledger.run_leases import RunLeaseRow
from resources.ledger.store import LedgerStore

__all__ = ["AbandonedRun", "abandoned_after_seconds", "abandoned_runs", "end_abandoned_runs"]


@dataclass(frozen=True)
class AbandonedRun:
    """A run ended by :func:`end_abandoned_runs`, and the evidence."""

    run_id: str
    steps: tuple[str, ...]  # "project/episode:step" of its lapsed claims (none: lease only)
    silent_seconds: float  # since its last sign of life
    message: str


def _row_silence(row: LedgerRow, now: datetime) -> float | None:
    """Seconds since the row's last sign of life (heartbeat, else start); None: unknown."""
    return silence(parse_timestamp(row.heartbeat_at) or parse_timestamp(row.started_at), now)


def abandoned_runs(
    instance: dg.DagsterInstance,
    rows: Sequence[LedgerRow],
    settings: ResumeSettings,
    now: datetime,
    leases: Mapping[str, RunLeaseRow] | None = None,
) -> list[AbandonedRun]:
    """The runs of this instance that only the ledger shows dead (see the module docstring).

    ``rows``: the ledger's running rows; ``leases``: the run leases of the runs to judge
    (the open ones, and those of runs that own a running row)."""
    leases = leases or {}
    silent_for = abandoned_after_seconds(settings.lease_seconds, settings.heartbeat_seconds)
    by_run: dict[str, list[LedgerRow]] = defaultdict(list)
    for row in rows:
        run_id = owner_run_id(str(row.run_id or ""))
        if run_id is not None:
            by_run[run_id].append(row)
    found = []
    for run_id in sorted(set(by_run) | set(leases)):
        owned = by_run.get(run_id, [])
        steps = tuple(f"{r.project_id}/{r.episode_id}:{r.step_id}" for r in owned)
        lease = leases.get(run_id)
        if lease is not None:
            if coordinator_alive(lease.heartbeat_at, lease.ended_at, settings, now):
                continue  # its coordinator renews: never end a live run
            quiet = silence(parse_timestamp(lease.heartbeat_at), now)
            if quiet is None:
                continue  # an unreadable heartbeat proves nothing either way
            why = (
                f"its coordinator ({lease.worker}) stopped renewing its run lease {quiet:.0f}s "
                f"ago (past the {settings.lease_seconds:g}s lease and a "
                f"{settings.heartbeat_seconds:g}s heartbeat)"
            )
        else:
            silences = [_row_silence(row, now) for row in owned]
            limits = [
                silent_for
                if row.heartbeat_at
                else max(settings.running_timeout_seconds, silent_for)
                for row in owned
            ]
            if any(s is None or s <= limit for s, limit in zip(silences, limits, strict=True)):
                continue  # a live (or unreadable) claim: never end a run that may be working
            quiet = min(s for s in silences if s is not None)
            why = (
                f"the ledger shows its worker gone; its claim(s) {', '.join(steps)} stopped "
                f"heartbeating {quiet:.0f}s ago (past the {settings.lease_seconds:g}s lease and "
                f"a {settings.heartbeat_seconds:g}s heartbeat) and it holds no live claim"
            )
        run = instance.get_run_by_id(run_id)
        if run is None or run.status in ENDED_RUN_STATUSES:
            continue  # another instance's run, or already ended (the dead-owner rule)
        message = f"ended by the resume sensor: {why}; its steps are recovered by a new run"
        found.append(AbandonedRun(run_id, steps, quiet, message))
    return found


def judged_leases(ledger: LedgerStore, rows: Sequence[LedgerRow]) -> dict[str, RunLeaseRow]:
    """The run leases a tick judges: every open one, and those of runs owning a running row
    (an ended lease with a running row left behind: its coordinator has finished)."""
    owners = sorted({r for r in (owner_run_id(str(row.run_id or "")) for row in rows) if r})
    leases = ledger.run_leases(open_only=True)
    if owners:
        leases.update(ledger.run_leases(owners))
    return leases


def end_abandoned_runs(
    instance: dg.DagsterInstance,
    running: Sequence[LedgerRow],
    settings: ResumeSettings,
    now: datetime,
    ledger: LedgerStore | None = None,
) -> list[AbandonedRun]:
    """Mark every abandoned run of this instance failed (``running``: the ledger's running
    rows; ``ledger``: where the run leases are, None for none); returns those ended. A lease
    left open by a run that has ended (its coordinator killed after the end, or ended here)
    is closed, so the open leases a tick reads stay the live ones."""
    leases = judged_leases(ledger, running) if ledger is not None else {}
    ended = []
    for abandoned in abandoned_runs(instance, running, settings, now, leases):
        run = instance.get_run_by_id(abandoned.run_id)
        if run is None or run.status in ENDED_RUN_STATUSES:
            continue
        instance.report_run_failed(run, abandoned.message)
        ended.append(abandoned)
    if ledger is not None:
        for run_id, lease in leases.items():
            if lease.ended_at is not None or coordinator_alive(
                lease.heartbeat_at, lease.ended_at, settings, now
            ):
                continue
            run = instance.get_run_by_id(run_id)
            if run is not None and run.status in ENDED_RUN_STATUSES:
                ledger.end_run(run_id)
    return ended
