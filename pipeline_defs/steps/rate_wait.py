"""A claimed run's side of the shared rate limit (docs/DESIGN.md#rate-limit).

:class:`LedgerThrottle` is the :class:`~resources.providers.throttle.Throttle` the provider
meter hands an HTTP provider: before each request it reserves the endpoint and model's next
slot in the ledger (one row every process shares) and sleeps until it, in short slices
that check the owner's guard (a fenced owner sends nothing) while the lease's heartbeat
thread goes on renewing the claim: waiting is not a failure and costs no lease. A wait of a
second or more is noted in ``rate_wait`` for ``storyboard status``. A 429 pauses every
process's calls to the endpoint for its ``Retry-After``.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pipeline_defs.project import ProviderConfig
from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.partition import StepKey
from resources.ledger.gcra import Limits
from resources.ledger.rate_limits import RateLimits

# A 429 without a usable Retry-After pauses the endpoint this long; a longer Retry-After
# than MAX_PAUSE_SECONDS is cut to it (a server's nonsense must not stop the fleet for good).
DEFAULT_PAUSE_SECONDS = 2.0
MAX_PAUSE_SECONDS = 600.0
# A wait is slept in slices of at most this, the owner's guard checked between them.
SLICE_SECONDS = 1.0
# Waits this long or longer are noted for ``storyboard status``.
NOTED_WAIT_SECONDS = 1.0


def limits_of(provider: ProviderConfig) -> Limits:
    """A project's rate limit settings."""
    return Limits(provider.requests_per_minute, provider.tokens_per_minute)


@dataclass
class LedgerThrottle:
    """The shared rate limit of one claimed step's calls."""

    rates: RateLimits
    key: StepKey
    run_id: str | None
    limits: Limits
    # Raises when the owner may no longer spend (the lease's check).
    guard: Callable[[], None] | None = None
    sleep: Callable[[float], None] = time.sleep
    # What this run met: seconds waited and 429s answered (for tests and benchmarks).
    waited: float = 0.0
    limited: int = 0

    def before_send(self, endpoint: str, model: str, tokens: int) -> None:
        noted = False
        try:
            while True:
                wait = self.rates.reserve(endpoint, model, self.limits, tokens)
                if wait <= 0:
                    return
                if wait >= NOTED_WAIT_SECONDS:
                    until = datetime.now(UTC) + timedelta(seconds=wait)
                    self.rates.note_wait(
                        self.key, self.run_id, endpoint, model, format_timestamp(until)
                    )
                    noted = True
                self._sleep(wait)
                # A 429 met meanwhile pauses the slot reserved before it: reserve again.
                if self.rates.paused_for(endpoint, model) <= 0:
                    return
        finally:
            if noted:
                self.rates.clear_wait(self.key, self.run_id)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self.guard is not None:
                self.guard()
            self.sleep(min(left, SLICE_SECONDS))
            self.waited += min(left, SLICE_SECONDS)
        if self.guard is not None:
            self.guard()

    def rate_limited(self, endpoint: str, model: str, retry_after: float | None) -> None:
        self.limited += 1
        seconds = DEFAULT_PAUSE_SECONDS if retry_after is None else retry_after
        self.rates.pause(endpoint, model, min(seconds, MAX_PAUSE_SECONDS))

    def settle(self, endpoint: str, model: str, estimated: int, used: int) -> None:
        self.rates.settle(endpoint, model, self.limits, estimated=estimated, used=used)
