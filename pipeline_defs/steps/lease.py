"""The owner's lease on a claimed step: renewed while the step runs.

A claimed row carries ``heartbeat_at``. While the owner works on it, a daemon thread renews
it every ``heartbeat_seconds`` with an owner-aware update (``WHERE run_id = :mine``); the
judge calls a running row stale only when its heartbeat is older than ``lease_seconds``, so
a step may run as long as it takes and is never stolen while its owner lives. A renewal that
matches no row means another run took the row over: the lease is lost, and :meth:`check`
(called by the provider meter before every model call, and by the protocol before it
publishes) raises ``step.ownership_lost`` — at most the calls already in flight are spent
twice.

A blip of the ledger (one dropped connection, a quick server restart) costs no beat: the
store re-runs the renewal on a fresh connection (resources.ledger.retry), and a renewal run
twice after a lost answer still matches the owner's row, so it never reads as "lost". Only
an outage longer than the store's retry budget fails a renewal (``ledger.unavailable``); it
is retried at the next beat, and the thread lives on whatever error a renewal raises. If the
outage outlasts the lease, the row becomes stealable and the next successful renewal finds
it lost.
"""

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from types import TracebackType

from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import ResumeSettings
from resources.ledger.store import LedgerStore

OWNERSHIP_LOST = ErrorCode.STEP_OWNERSHIP_LOST


class Lease:
    def __init__(
        self,
        ledger: LedgerStore,
        key: StepKey,
        run_id: str,
        *,
        interval_seconds: float,
        log: logging.Logger | logging.LoggerAdapter,  # type: ignore[type-arg]
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # ``run_id``: the claim's fencing token (docs/DESIGN.md#claim-tokens), not the run's.
        # ``clock``: monotonic seconds (a test's own clock makes "the thread is behind" exact).
        self.ledger = ledger
        self.key = key
        self.run_id = run_id
        self.interval = interval_seconds
        self.log = log
        self.renewals = 0
        # Renewals that failed with an error (not "lost"): an outage past the store's retry.
        self.failures = 0
        self._lost = threading.Event()
        self.clock = clock
        self._renewed_at = clock()  # the claim itself set the heartbeat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{key.step_id}", daemon=True)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def check(self) -> None:
        """Raise ``step.ownership_lost`` if the row is no longer ours. When the renewal
        thread is behind (two intervals without a renewal: the process was paused or
        starved), the row is asked now rather than trusting the last renewal: a worker
        resumed after a SIGSTOP past its lease would otherwise pay for the next call before
        its thread noticed."""
        if not self._lost.is_set() and self.clock() - self._renewed_at > 2 * self.interval:
            self._renew_now()
        if self._lost.is_set():
            raise PipelineError(
                OWNERSHIP_LOST,
                f"{self.key}: run {self.run_id} lost its lease (another run took the row "
                "over); no further provider call, nothing published",
            )

    def _renew_now(self) -> None:
        """One renewal from the caller's thread; an error is no loss (the thread retries)."""
        try:
            renewed = self.ledger.heartbeat(self.key, self.run_id)
        except Exception as exc:  # an outage past the store's retry: no evidence of a loss
            self.log.warning("%s: lease renewal failed (%s); retrying", self.key, exc)
            return
        if not renewed:
            self._lost.set()
            self.log.warning("%s: lease of run %s lost", self.key, self.run_id)
            return
        self._renewed_at = self.clock()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                renewed = self.ledger.heartbeat(self.key, self.run_id)
            except Exception as exc:  # an outage past the store's retry: the next beat tries
                self.failures += 1
                self.log.warning("%s: lease renewal failed (%s); retrying", self.key, exc)
                continue
            if not renewed:
                self._lost.set()
                self.log.warning("%s: lease of run %s lost", self.key, self.run_id)
                return
            self.renewals += 1
            self._renewed_at = self.clock()

    def __enter__(self) -> "Lease":
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=max(5.0, self.interval))


class RunLease:
    """The lease of a run's coordinator (docs/DESIGN.md#run-leases): taken when the process
    that hands the run's steps out starts, renewed every ``interval_seconds`` by a daemon
    thread, ended when it finishes. The resume sensor ends a run whose lease stopped being
    renewed (its coordinator died: the run would hold its episode's queue slot for ever) and
    never a run whose lease is fresh, however long its steps wait for a worker.

    Fail-soft: a ledger that cannot be reached at the start leaves the run without a lease
    (judged by its claims' heartbeats, as before), never fails the run; a renewal error is
    retried at the next beat.
    """

    def __init__(
        self,
        ledger: LedgerStore,
        run_id: str,
        *,
        interval_seconds: float,
        log: logging.Logger | logging.LoggerAdapter,  # type: ignore[type-arg]
    ) -> None:
        self.ledger = ledger
        self.run_id = run_id
        self.interval = interval_seconds
        self.log = log
        self.held = False
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="run-lease", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not self.ledger.renew_run(self.run_id):
                    self.log.warning("run %s: its run lease was ended elsewhere", self.run_id)
                    return
            except Exception as exc:  # an outage past the store's retry: the next beat tries
                self.log.warning("run %s: run lease renewal failed (%s)", self.run_id, exc)
                continue
            self.renewals += 1

    def __enter__(self) -> "RunLease":
        try:
            self.ledger.begin_run(self.run_id)
        except Exception as exc:
            self.log.warning("run %s: no run lease (%s); judged by its claims", self.run_id, exc)
            return self
        self.held = True
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if not self.held:
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, self.interval))
        try:
            self.ledger.end_run(self.run_id)
        except Exception as exc:  # it lapses on its own; the sensor finds the run ended
            self.log.warning("run %s: could not end its run lease (%s)", self.run_id, exc)


def abandoned_after_seconds(lease_seconds: float, heartbeat_seconds: float) -> float:
    """How long a run's proof of life (its run lease, else its claims) must be silent before
    the sensor ends it: the lease plus one heartbeat interval, so a beat that is merely late
    is never taken for a dead process. A live owner renews every heartbeat interval."""
    return lease_seconds + heartbeat_seconds


def silence(seen: datetime | None, now: datetime) -> float | None:
    """Seconds since ``seen`` (a heartbeat, a start); None when it is unknown."""
    return None if seen is None else (now - seen).total_seconds()


def coordinator_alive(
    heartbeat_at: str | None, ended_at: str | None, settings: ResumeSettings, now: datetime
) -> bool:
    """A run lease (``run_lease`` row) proves its coordinator alive: not ended, and renewed
    within :func:`abandoned_after_seconds` (an unreadable heartbeat proves nothing)."""
    if ended_at is not None:
        return False
    quiet = silence(parse_timestamp(heartbeat_at), now)
    limit = abandoned_after_seconds(settings.lease_seconds, settings.heartbeat_seconds)
    return quiet is not None and quiet <= limit
