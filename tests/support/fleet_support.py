"""The machine's Celery broker (RabbitMQ) and result backend (Redis) for the fleet's tests.

``PIPELINE_REQUIRE_BROKER=1`` (CI) turns "cannot reach them" into a failure instead of a skip.
The broker URL carries the password on purpose: the tests check it reaches no run storage.
"""

import contextlib
import os
import signal
import subprocess

import pytest
from kombu.connection import Connection

BROKER_URL = os.environ.get("PIPELINE_TEST_BROKER_URL", "pyamqp://guest:guest@127.0.0.1:5672//")
BACKEND_URL = os.environ.get("PIPELINE_TEST_BACKEND_URL", "redis://127.0.0.1:6379/0")
REQUIRE_ENV = "PIPELINE_REQUIRE_BROKER"


def broker_problem(broker_url: str = BROKER_URL, backend_url: str = BACKEND_URL) -> str | None:
    """Why the broker or the backend cannot be used here, or None."""
    import redis

    try:
        # kombu ships py.typed but leaves Connection.__init__ unannotated (its stub gap).
        with Connection(broker_url, connect_timeout=3) as connection:  # type: ignore[no-untyped-call]
            connection.ensure_connection(max_retries=1, timeout=3)
    except Exception as exc:
        return f"RabbitMQ at {broker_url}: {type(exc).__name__}: {exc}"
    try:
        redis.Redis.from_url(backend_url, socket_connect_timeout=3).ping()
    except Exception as exc:
        return f"Redis at {backend_url}: {type(exc).__name__}: {exc}"
    return None


def require_broker() -> str:
    """The broker URL, or skip (fail under ``PIPELINE_REQUIRE_BROKER=1``) naming what is down."""
    problem = broker_problem()
    if problem is not None:
        message = f"the fleet tests need a Celery broker and backend: {problem}"
        if os.environ.get(REQUIRE_ENV, "") not in ("", "0", "false"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return BROKER_URL


def delete_queue(broker_url: str, queue: str) -> None:
    """Remove a test's queue from the shared broker (best effort)."""
    # kombu's Connection.__init__ is unannotated (as in broker_problem above).
    with (
        contextlib.suppress(Exception),
        Connection(broker_url, connect_timeout=3) as connection,  # type: ignore[no-untyped-call]
    ):
        connection.default_channel.queue_delete(queue)


def stop_group(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Stop a process group a test started (a worker and its pool), by its pid only."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # pool processes that outlived their parent
