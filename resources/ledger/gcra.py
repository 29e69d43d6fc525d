"""The shared rate limit's arithmetic (docs/DESIGN.md#rate-limit): pure, no database.

One state per endpoint and model, held in the ledger's ``rate_limit`` row and changed only
under its row lock. GCRA without a burst: the next request may go at ``request_at`` (its
theoretical arrival time) and moves it one interval on, so grants are spaced evenly and a
server counting any sliding minute never sees more than ``requests_per_minute``. Tokens work
the same way on ``token_at``, each call moving it by the time its estimated tokens take at
``tokens_per_minute`` (settled to the reported usage afterwards). ``paused_until`` is an
endpoint's ``Retry-After``: nothing goes before it. Times are seconds on the ledger's clock.
"""

from dataclasses import dataclass, replace

SECONDS_PER_MINUTE = 60.0
# Grants are spaced this much wider than the limit: arrivals at the server may jitter
# against the grants by up to SLACK * 60 s (1.2 s) and a sliding minute still holds.
SLACK = 0.02


@dataclass(frozen=True)
class Limits:
    """A project's ``provider.requests_per_minute`` / ``tokens_per_minute`` (None: none)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    @property
    def request_interval(self) -> float:
        """Seconds between two grants (0 without a request limit)."""
        if not self.requests_per_minute:
            return 0.0
        return SECONDS_PER_MINUTE * (1 + SLACK) / self.requests_per_minute

    def token_seconds(self, tokens: int) -> float:
        """Seconds ``tokens`` take at the token limit (0 without one)."""
        if not self.tokens_per_minute:
            return 0.0
        return SECONDS_PER_MINUTE * (1 + SLACK) * tokens / self.tokens_per_minute


@dataclass(frozen=True)
class RateState:
    """One endpoint and model's ``rate_limit`` row."""

    request_at: float = 0.0
    token_at: float = 0.0
    paused_until: float = 0.0


def reserve(state: RateState, limits: Limits, now: float, tokens: int) -> tuple[RateState, float]:
    """The next slot for one call of ``tokens`` estimated tokens: the new state and how long
    the caller waits for its slot (0: go now)."""
    start = max(now, state.paused_until)
    if limits.requests_per_minute:
        start = max(start, state.request_at)
    if limits.tokens_per_minute:
        start = max(start, state.token_at)
    after = replace(
        state,
        request_at=start + limits.request_interval if limits.requests_per_minute else 0.0,
        token_at=start + limits.token_seconds(tokens) if limits.tokens_per_minute else 0.0,
    )
    return after, start - now


def pause(state: RateState, now: float, seconds: float) -> RateState:
    """An endpoint's ``Retry-After``: nothing goes before ``now + seconds``."""
    until = now + max(0.0, seconds)
    return replace(
        state,
        paused_until=max(state.paused_until, until),
        request_at=max(state.request_at, until),
        token_at=max(state.token_at, until),
    )


def settle(state: RateState, limits: Limits, estimated: int, used: int) -> RateState:
    """A call's estimated tokens replaced by the tokens it used."""
    if not limits.tokens_per_minute or used == estimated:
        return state
    return replace(state, token_at=state.token_at + limits.token_seconds(used - estimated))
