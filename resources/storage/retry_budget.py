"""The retry budget of a bucket storage and its classification of failures.

:class:`RetryBudget`: how long a bucket storage keeps trying through transient failures
(``PIPELINE_STORAGE_RETRIES``, ``PIPELINE_STORAGE_RETRY_BUDGET_SECONDS``,
``PIPELINE_STORAGE_TIMEOUT_SECONDS``, read when the storage is opened, their defaults and
bounds rows of ``pipeline_defs/resume/settings_registry.py``), as obstore's client
and retry options and as the bound of the conditional puts' own loop. What a failure is:
:func:`transient` (worth another try), :func:`in_doubt` (the try may have reached the
store), read from obstore 0.12's error text; :func:`backoff` (exponential, with jitter).
"""

import math
import random
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.settings_registry import SETTINGS, read
from resources.storage.base import error_details

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig

# obstore 0.12's error text (its debug part) says what failed: an HTTP status, or the kind
# of transport error. Connect: nothing was sent; the others may have reached the store.
_STATUS = re.compile(r"\bstatus: (\d{3})\b")
_HTTP_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")
_TRANSIENT_KINDS = frozenset({"Connect", "Request", "Timeout", "Interrupted", "Decode"})
_TRANSIENT_STATUS = frozenset({408, 429})
_INIT_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 15.0
_UNCOUNTED = 1_000_000  # "no count": the budget in seconds ends the retries first


@dataclass(frozen=True)
class RetryBudget:
    """How long a bucket storage keeps trying through transient failures."""

    timeout_s: float = SETTINGS["storage_timeout_seconds"].default
    # No count of its own by default: an outage is waited out by time, within ``budget_s``
    # (ten quick retries of a refused connection were spent in seconds, and a step that
    # had paid failed in a one-minute outage). ``PIPELINE_STORAGE_RETRIES`` caps it.
    retries: int | None = SETTINGS["storage_retries"].default
    budget_s: float = SETTINGS["storage_retry_budget_seconds"].default

    # field -> its setting in the registry
    SETTING = {
        "timeout_s": SETTINGS["storage_timeout_seconds"],
        "retries": SETTINGS["storage_retries"],
        "budget_s": SETTINGS["storage_retry_budget_seconds"],
    }
    ENV = {field: setting.var for field, setting in SETTING.items()}

    @classmethod
    def from_env(cls, storage: str) -> "RetryBudget":
        """The budget the ``PIPELINE_STORAGE_*`` variables set (read when opening)."""
        values: dict[str, float | int] = {}
        for field, setting in cls.SETTING.items():
            name = setting.var
            text = read(name).strip()
            if not text:
                continue
            try:
                value = int(text) if setting.type is int else float(text)
            except ValueError:
                value = -1
            low, high = setting.closed_range()
            if not (math.isfinite(value) and low <= value <= high):
                what = field.split("_")[0]
                cause = f"{name}={text!r} is not a number of {what} in [{low:g}, {high:g}]"
                raise PipelineError(
                    ErrorCode.STORAGE_CONFIG,
                    f"cannot open storage {storage}: {cause}",
                    details=error_details(storage, None, cause),
                )
            values[field] = value
        return cls(**values)  # type: ignore[arg-type]

    @property
    def max_retries(self) -> int:
        """The count obstore and the put loop stop at: the cap, or none but the budget."""
        return _UNCOUNTED if self.retries is None else self.retries

    def describe(self) -> str:
        tries = "with no count limit" if self.retries is None else f"up to {self.retries} retries"
        return (
            f"transient errors were retried {tries} within a budget "
            f"of {secs(self.budget_s)}, each request timing out after "
            f"{secs(self.timeout_s)} ({self.ENV['retries']}, {self.ENV['budget_s']}, "
            f"{self.ENV['timeout_s']})"
        )

    def client_options(self, allow_http: bool) -> "ClientConfig":
        options: ClientConfig = {
            "timeout": timedelta(seconds=self.timeout_s),
            "connect_timeout": timedelta(seconds=min(5.0, self.timeout_s)),
        }
        if allow_http:  # given options replace the environment's: keep its AWS_ALLOW_HTTP
            options["allow_http"] = True
        return options

    def retry_config(self, retries: int | None = None) -> "RetryConfig":
        return {
            "max_retries": self.max_retries if retries is None else retries,
            "retry_timeout": timedelta(seconds=self.budget_s),
            "backoff": {
                "init_backoff": timedelta(seconds=_INIT_BACKOFF_S),
                "max_backoff": timedelta(seconds=min(_MAX_BACKOFF_S, self.budget_s)),
                "base": 2,
            },
        }


def secs(value: float) -> str:
    """A number of seconds as the error texts write it."""
    return f"{value:g} s"


def transport_kind(exc: BaseException) -> str | None:
    """The kind of transport error obstore names (``Connect``, ``Timeout``, ...), if any."""
    kind = _HTTP_KIND.search(str(exc))
    return None if kind is None else kind.group(1)


def transient(exc: BaseException) -> bool:
    """A failure worth another try: a transport error or a 5xx/408/429 answer."""
    status = _STATUS.search(str(exc))
    if status is not None:
        code = int(status.group(1))
        return code >= 500 or code in _TRANSIENT_STATUS
    return transport_kind(exc) in _TRANSIENT_KINDS


def in_doubt(exc: BaseException) -> bool:
    """Whether the failed try may have reached the store (all but a refused connection)."""
    return transport_kind(exc) != "Connect"


def backoff(attempt: int) -> float:
    """Exponential backoff with jitter (half to full of 0.1 s x 2^attempt, capped)."""
    ceiling: float = min(_MAX_BACKOFF_S, _INIT_BACKOFF_S * 2.0 ** min(attempt, 30))
    return ceiling * (0.5 + random.random() / 2)
