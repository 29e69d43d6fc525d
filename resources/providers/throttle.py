"""The door a shared rate limit takes into a provider call (docs/DESIGN.md#rate-limit).

The run protocol's provider meter sets a :class:`Throttle` for the duration of one metered
call (:func:`throttled`); an HTTP provider asks it before each request it sends
(``before_send``: waits for the endpoint and model's slot), tells it of a 429
(``rate_limited``: every process's calls to that endpoint wait ``Retry-After``) and of the
tokens a reply used (``settle``). Without one (a direct call, a test) nothing waits.
"""

import contextlib
import contextvars
import email.utils
import time
from collections.abc import Iterator, Mapping
from typing import Protocol

# A text call's reply allowance in the token estimate made before it is sent (settled to the
# reported usage after): a storyboard step's JSON answer is a few hundred tokens.
REPLY_TOKENS_ESTIMATE = 500
# Characters per token, for the estimate of a request's input tokens.
CHARS_PER_TOKEN = 4


class Throttle(Protocol):
    def before_send(self, endpoint: str, model: str, tokens: int) -> None:
        """Wait until a request of ``tokens`` estimated tokens may go to ``endpoint``."""

    def rate_limited(self, endpoint: str, model: str, retry_after: float | None) -> None:
        """``endpoint`` answered 429, asking to wait ``retry_after`` seconds (None: unsaid)."""

    def settle(self, endpoint: str, model: str, estimated: int, used: int) -> None:
        """The request estimated at ``estimated`` tokens used ``used``."""


_CURRENT: contextvars.ContextVar[Throttle | None] = contextvars.ContextVar(
    "provider_throttle", default=None
)


def current_throttle() -> Throttle | None:
    """The throttle of the metered call running in this thread, if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def throttled(throttle: Throttle | None) -> Iterator[None]:
    """Calls made inside go through ``throttle``."""
    token = _CURRENT.set(throttle)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def estimate_tokens(text: str) -> int:
    """A text request's tokens before it is sent: its input's, plus a reply allowance."""
    return len(text) // CHARS_PER_TOKEN + 1 + REPLY_TOKENS_ESTIMATE


def retry_after_seconds(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """``Retry-After`` of a response in seconds (``retry-after-ms``, seconds or an HTTP date);
    None when it says nothing usable."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
