"""Which engine runs a run's steps: the run's own process tree, or a Celery fleet.

``PIPELINE_EXECUTOR=celery`` hands each step of every run (launchpad, resume sensor,
backfill, ``storyboard materialize``) to a Celery worker (``storyboard worker``) through the
broker; the workers share only the ledger, the Dagster instance (PostgreSQL) and the
storage (docs/DESIGN.md#fleet). Read at call time, never at import.
"""

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from pipeline_defs.resume.errors import ErrorCode, PipelineError

EXECUTOR_ENV = "PIPELINE_EXECUTOR"
BROKER_ENV = "PIPELINE_CELERY_BROKER_URL"
BACKEND_ENV = "PIPELINE_CELERY_BACKEND_URL"
QUEUE_ENV = "PIPELINE_CELERY_QUEUE"
FLEET_ENV_NAMES = (EXECUTOR_ENV, BROKER_ENV, BACKEND_ENV, QUEUE_ENV)

MULTIPROCESS = "multiprocess"  # Dagster's default: a process per step beside the run worker
CELERY = "celery"
EXECUTORS = (MULTIPROCESS, CELERY)

DEFAULT_BROKER_URL = "pyamqp://guest@127.0.0.1:5672//"
DEFAULT_BACKEND_URL = "redis://127.0.0.1:6379/0"
DEFAULT_QUEUE = "dagster"
BROKER_SCHEMES = ("amqp", "pyamqp", "amqps", "redis", "rediss")
BACKEND_SCHEMES = ("redis", "rediss", "rpc")
# A queue name both sides can declare (RabbitMQ allows more; this is enough and safe in
# routing keys, where the queue name is followed by ``.execute_plan``).
QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,99}$")


def masked(url: str) -> str:
    """``url`` with its password replaced: a broker URL is a secret's holder."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


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
    return value


@dataclass(frozen=True)
class FleetSettings:
    """The engine of step execution and, for Celery, where its broker and queue are."""

    executor: str = MULTIPROCESS
    broker_url: str = DEFAULT_BROKER_URL
    backend_url: str = DEFAULT_BACKEND_URL
    queue: str = DEFAULT_QUEUE

    @property
    def celery(self) -> bool:
        return self.executor == CELERY

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, queue: str | None = None
    ) -> "FleetSettings":
        """The settings of ``env`` (default: this process's), each refused by its variable."""
        source = os.environ if env is None else env
        executor = source.get(EXECUTOR_ENV, "").strip().lower() or MULTIPROCESS
        if executor not in EXECUTORS:
            raise _invalid(EXECUTOR_ENV, executor, f"expected one of {', '.join(EXECUTORS)}")
        broker = _url(
            BROKER_ENV, source.get(BROKER_ENV, "").strip() or DEFAULT_BROKER_URL, BROKER_SCHEMES
        )
        backend = _url(
            BACKEND_ENV,
            source.get(BACKEND_ENV, "").strip() or DEFAULT_BACKEND_URL,
            BACKEND_SCHEMES,
        )
        name = queue if queue is not None else source.get(QUEUE_ENV, "").strip()
        name = name or DEFAULT_QUEUE
        if not QUEUE_NAME.match(name):
            variable = QUEUE_ENV if queue is None else "--queue"
            raise _invalid(variable, name, "a queue name is 1-100 letters, digits, '_' or '-'")
        return cls(executor, broker, backend, name)
