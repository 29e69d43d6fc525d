"""Which engine runs a run's steps: the run's own process tree, or a Celery fleet.

``PIPELINE_EXECUTOR=celery`` hands each step of every run (launchpad, resume sensor,
backfill, ``storyboard materialize``) to a Celery worker (``storyboard worker``) through the
broker; the workers share only the ledger, the Dagster instance (PostgreSQL) and the
storage (docs/DESIGN.md#fleet). Read at call time, never at import, each variable's name,
default and bounds from its row of the settings registry.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.settings_registry import SETTINGS, read

_EXECUTOR = SETTINGS["executor"]
_BROKER = SETTINGS["celery_broker_url"]
_BACKEND = SETTINGS["celery_backend_url"]
_QUEUE = SETTINGS["celery_queue"]
_QUEUE_WAIT = SETTINGS["celery_queue_wait_seconds"]
EXECUTOR_ENV = _EXECUTOR.var
BROKER_ENV = _BROKER.var
BACKEND_ENV = _BACKEND.var
QUEUE_ENV = _QUEUE.var
QUEUE_WAIT_ENV = _QUEUE_WAIT.var
FLEET_ENV_NAMES = (EXECUTOR_ENV, BROKER_ENV, BACKEND_ENV, QUEUE_ENV, QUEUE_WAIT_ENV)

MULTIPROCESS = "multiprocess"  # Dagster's default: a process per step beside the run worker
CELERY = "celery"
EXECUTORS = (MULTIPROCESS, CELERY)

DEFAULT_BROKER_URL: str = _BROKER.default
DEFAULT_BACKEND_URL: str = _BACKEND.default
DEFAULT_QUEUE: str = _QUEUE.default
# How long a run's coordinator lets a step wait on a queue no worker consumes before the run
# fails naming the queue (it warns in the run's event log at once): long enough for a worker
# to be started by hand or by an autoscaler, short enough that nobody waits for ever.
DEFAULT_QUEUE_WAIT_SECONDS: float = _QUEUE_WAIT.default
QUEUE_WAIT_BOUNDS = _QUEUE_WAIT.closed_range()
# The run tag a coordinator sets to the queue(s) its steps wait on while no worker consumes
# them (empty once one does): what ``storyboard status`` reports without asking the broker.
UNSERVED_QUEUE_TAG = "storyboard/unserved_queue"
BROKER_SCHEMES = ("amqp", "pyamqp", "amqps", "redis", "rediss")
BACKEND_SCHEMES = ("redis", "rediss", "rpc")
# A queue name both sides can declare (RabbitMQ allows more; this is enough and safe in
# routing keys, where the queue name is followed by ``.execute_plan``).
QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,99}$")


def masked(url: str) -> str:
    """``url`` with its password replaced: a broker URL is a secret's holder.

    The user part ends at the *last* ``@``: a password holding ``#``, ``/`` or ``?``
    unencoded would otherwise be read as the start of a fragment, a path or a query and
    printed whole (``urlsplit`` stops the authority at the first of them).
    """
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    userinfo, host = rest.rsplit("@", 1)
    user, colon, _password = userinfo.partition(":")
    return f"{scheme}://{user}:***@{host}" if colon else f"{scheme}://***@{host}"


def _invalid(variable: str, value: str, why: str) -> PipelineError:
    return PipelineError(
        ErrorCode.SETTINGS_INVALID,
        f"invalid setting {variable}={masked(value)!r}: {why}",
        details={"setting": variable},
    )


def _url(variable: str, value: str, schemes: tuple[str, ...]) -> str:
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if scheme not in schemes:
        raise _invalid(variable, value, f"expected a URL with a scheme of {', '.join(schemes)}")
    authority = value.split("://", 1)[1]
    cut = min((authority.find(c) for c in "/?#" if c in authority), default=len(authority))
    if "@" in authority[cut:] and "@" not in authority[:cut]:
        raise _invalid(
            variable,
            value,
            "its password holds '/', '?' or '#' unencoded (percent-encode it: %2F, %3F, %23)",
        )
    try:
        parts = urlsplit(value)
        port = parts.port  # raises for a port that is no number in 0-65535
    except ValueError as exc:
        raise _invalid(variable, value, f"the URL does not parse ({exc})") from None
    if scheme != "rpc" and not parts.hostname:
        raise _invalid(variable, value, "the URL names no host")
    if port == 0:
        raise _invalid(variable, value, "port 0 is no port")
    return value


def _seconds(variable: str, value: str, bounds: tuple[float, float]) -> float:
    low, high = bounds
    try:
        seconds = float(value)
    except ValueError:
        raise _invalid(variable, value, "expected a number of seconds") from None
    if not low <= seconds <= high:  # NaN fails both comparisons
        raise _invalid(variable, value, f"expected seconds between {low:g} and {high:g}")
    return seconds


def worker_command(queue: str) -> str:
    """The command that starts a worker taking steps from ``queue``."""
    return f"storyboard worker --queue {queue}"


@dataclass(frozen=True)
class FleetSettings:
    """The engine of step execution and, for Celery, where its broker and queue are."""

    executor: str = MULTIPROCESS
    broker_url: str = DEFAULT_BROKER_URL
    backend_url: str = DEFAULT_BACKEND_URL
    queue: str = DEFAULT_QUEUE
    # A step's wait on a queue no worker consumes, before its run fails (``QUEUE_WAIT_ENV``).
    queue_wait_seconds: float = DEFAULT_QUEUE_WAIT_SECONDS

    @property
    def celery(self) -> bool:
        return self.executor == CELERY

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, queue: str | None = None
    ) -> "FleetSettings":
        """The settings of ``env`` (default: this process's), each refused by its variable."""
        executor = read(EXECUTOR_ENV, env).strip().lower() or MULTIPROCESS
        if executor not in EXECUTORS:
            raise _invalid(EXECUTOR_ENV, executor, f"expected one of {', '.join(EXECUTORS)}")
        broker = _url(
            BROKER_ENV, read(BROKER_ENV, env).strip() or DEFAULT_BROKER_URL, BROKER_SCHEMES
        )
        backend = _url(
            BACKEND_ENV,
            read(BACKEND_ENV, env).strip() or DEFAULT_BACKEND_URL,
            BACKEND_SCHEMES,
        )
        if queue is not None and not queue.strip():
            raise _invalid("--queue", queue, "a queue name is 1-100 letters, digits, '_' or '-'")
        name = queue if queue is not None else read(QUEUE_ENV, env).strip()
        name = name or DEFAULT_QUEUE
        if not QUEUE_NAME.match(name):
            variable = QUEUE_ENV if queue is None else "--queue"
            raise _invalid(variable, name, "a queue name is 1-100 letters, digits, '_' or '-'")
        wait = read(QUEUE_WAIT_ENV, env).strip()
        wait_seconds = (
            _seconds(QUEUE_WAIT_ENV, wait, QUEUE_WAIT_BOUNDS)
            if wait
            else DEFAULT_QUEUE_WAIT_SECONDS
        )
        return cls(executor, broker, backend, name, wait_seconds)
