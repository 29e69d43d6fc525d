"""Runs left STARTED for ever: ended on the ledger's evidence, so their episode's queue opens.

A run whose worker vanished (a ``storyboard materialize`` killed with ``kill -9``, a pod or
host lost under a run launcher that cannot check its workers) stays STARTED in Dagster: run
monitoring never ends it there. With the shipped run queue (one run per
``dagster/partition``) the recovery the resume sensor requests for its lapsed lease then
waits behind it for good. The ledger knows better: the run's claims stopped heartbeating.

:func:`end_abandoned_runs` (called by the resume sensor every tick) marks such a run failed,
naming the evidence, when all of this holds (docs/DESIGN.md#dead-owners):

- this Dagster instance knows the run and it has not ended (a run another deployment's
  instance holds is never touched: its heartbeat alone decides, and the lease rules recover
  its rows);
- it owns at least one running ledger row, and every one of them lapsed and missed one more
  heartbeat: silent longer than :func:`abandoned_after_seconds` (a lease plus a heartbeat
  interval; a row without a heartbeat: past the running timeout). A killed worker then costs
  at most one lease plus two sensor intervals plus the dequeue interval before its step is
  claimed again: one interval to notice the lapse and end the run, the dequeue to start the
  recovery the sensor already requested;
- it holds no live claim (no row of it inside its lease).

Nothing is written to the ledger: the recovery run takes the rows over (an expected-match
steal) once the queue lets it start.
"""

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import dagster as dg

from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.wiring.assets import ENDED_RUN_STATUSES, owner_run_id


def abandoned_after_seconds(lease_seconds: float, heartbeat_seconds: float) -> float:
    """How long a run's claims must be silent before the sensor ends its run: the lease (past
    it the claim is anyone's anyway) plus one heartbeat interval, so a beat that is merely
    late is never taken for a dead worker. A live owner renews every heartbeat interval."""
    return lease_seconds + heartbeat_seconds


@dataclass(frozen=True)
class AbandonedRun:
    """A run ended by :func:`end_abandoned_runs`, and the evidence."""

    run_id: str
    steps: tuple[str, ...]  # "project/episode:step" of its lapsed claims
    silent_seconds: float  # since its most recent heartbeat (or start, without one)
    message: str


def _silence(row: LedgerRow, now: datetime) -> float | None:
    """Seconds since the row's last sign of life (heartbeat, else start); None: unknown."""
    seen = parse_timestamp(row.heartbeat_at) or parse_timestamp(row.started_at)
    return None if seen is None else (now - seen).total_seconds()


def abandoned_runs(
    instance: dg.DagsterInstance,
    rows: Sequence[LedgerRow],
    settings: ResumeSettings,
    now: datetime,
) -> list[AbandonedRun]:
    """The runs of this instance that only the ledger shows dead (see the module docstring)."""
    by_run: dict[str, list[LedgerRow]] = defaultdict(list)
    for row in rows:
        run_id = owner_run_id(str(row.run_id or ""))
        if run_id is not None:
            by_run[run_id].append(row)
    found = []
    for run_id, owned in sorted(by_run.items()):
        silences = [_silence(row, now) for row in owned]
        silent_for = abandoned_after_seconds(settings.lease_seconds, settings.heartbeat_seconds)
        limits = [
            silent_for if row.heartbeat_at else max(settings.running_timeout_seconds, silent_for)
            for row in owned
        ]
        if any(s is None or s <= limit for s, limit in zip(silences, limits, strict=True)):
            continue  # a live (or unreadable) claim: never end a run that may be working
        run = instance.get_run_by_id(run_id)
        if run is None or run.status in ENDED_RUN_STATUSES:
            continue  # another instance's run, or already ended (the dead-owner rule)
        quiet = min(s for s in silences if s is not None)
        steps = tuple(f"{r.project_id}/{r.episode_id}:{r.step_id}" for r in owned)
        message = (
            f"ended by the resume sensor: the ledger shows its worker gone; its claim(s) "
            f"{', '.join(steps)} stopped heartbeating {quiet:.0f}s ago (past the "
            f"{settings.lease_seconds:g}s lease and a {settings.heartbeat_seconds:g}s "
            "heartbeat) and it holds no live claim; its steps are recovered by a new run"
        )
        found.append(AbandonedRun(run_id, steps, quiet, message))
    return found


def end_abandoned_runs(
    instance: dg.DagsterInstance,
    running: Sequence[LedgerRow],
    settings: ResumeSettings,
    now: datetime,
) -> list[AbandonedRun]:
    """Mark every abandoned run of this instance failed (``running``: the ledger's running
    rows); returns those ended."""
    ended = []
    for abandoned in abandoned_runs(instance, running, settings, now):
        run = instance.get_run_by_id(abandoned.run_id)
        if run is None or run.status in ENDED_RUN_STATUSES:
            continue
        instance.report_run_failed(run, abandoned.message)
        ended.append(abandoned)
    return ended
