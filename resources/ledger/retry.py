"""A ledger that blinks: a dropped PostgreSQL connection is retried, bounded.

A restart of the server, a failover or an idle-session timeout ends every session: the next
statement on a pooled connection fails with ``AdminShutdown`` / "server closed the
connection", and for a moment new connections are refused. Every store operation is one
short unit of work that opens its own connection, so the store re-runs the *whole* unit on
a fresh connection — never a half of it — and each unit is written so that running it again
after an unknown outcome (the commit was sent, its acknowledgement lost) changes nothing
more: owner-aware updates with fixed values, compare-and-set claims that recognise their
own earlier win, provider-call rows keyed by an id chosen before the first attempt.

Only a dropped or refused connection is retried: a serialization failure, a lock timeout, a
constraint violation, a wrong password or a missing database is not a blip and fails at
once, as before. The embedded SQLite ledger is never retried (``database is locked`` is
contention, handled by its busy timeout, not an outage). Past the budget the operation fails
with ``ledger.unavailable`` naming the server (``host:port/db``, never the password).
"""

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from pipeline_defs.resume.causes import LEDGER_PERMANENT_MARKERS, one_line
from pipeline_defs.resume.errors import ErrorCode, PipelineError

T = TypeVar("T")

# Pauses before the 2nd, 3rd, ... attempt after a dropped connection: 8 attempts, 5.0 s of
# waiting in all. The first retry is immediate: after a blip long past, the pool's
# connections are all dead and the first statement finds out (SQLAlchemy then invalidates
# the whole pool), so one immediate retry on a fresh connection costs nothing. The later
# pauses double: a `pg_ctl restart -m fast` of a small server takes ~0.23 s from the first
# refused session to accepting connections again (measured with tests/support/pg_throwaway:
# stop 0.11 s + start 0.12 s), a loaded one with a shutdown checkpoint a few seconds, and
# ~5 s stays well under a step lease (60 s by default), so an outage longer than that is
# reported as one instead of holding the step (an operation against a stopped server fails
# after 5.0-5.5 s: tests/ledger/test_ledger_blip.py measures it).
RETRY_PAUSES_SECONDS: tuple[float, ...] = (0.0, 0.1, 0.2, 0.4, 0.8, 1.5, 2.0)

# SQLSTATEs of a session the server ended or would not start: 08xxx connection exceptions,
# 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now ("the database
# system is starting up / shutting down"), 57P05 idle_session_timeout.
_DROPPED_STATES = frozenset({"57P01", "57P02", "57P03", "57P05"})

log = logging.getLogger("storyboard.ledger")


def _driver_error(exc: BaseException) -> BaseException:
    """The DBAPI error inside a SQLAlchemy wrapper (or ``exc`` itself)."""
    orig = getattr(exc, "orig", None)
    return orig if isinstance(orig, BaseException) else exc


def is_dropped_connection(exc: BaseException) -> bool:
    """Whether ``exc`` means the PostgreSQL session was lost or could not be opened."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True  # SQLAlchemy saw the connection closed/broken after the error
    driver = _driver_error(exc)
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the PostgreSQL ledger needs it
        return False
    if not isinstance(driver, psycopg.OperationalError | psycopg.InterfaceError):
        return False
    state = getattr(driver, "sqlstate", None)
    if state is not None:
        return state.startswith("08") or state in _DROPPED_STATES
    # A failed connection attempt carries no SQLSTATE: retried unless its text says that
    # the server answered and refused us for good (no such database, wrong password).
    text = str(driver).lower()
    return not any(marker in text for marker in LEDGER_PERMANENT_MARKERS)


def server_name(url: str) -> str:
    """``host:port/database`` of a PostgreSQL URL: how messages name the ledger (no user,
    no password)."""
    parsed = sa.engine.make_url(url)
    host = parsed.host or str(parsed.query.get("host") or "localhost")
    return f"{host}:{parsed.port or 5432}/{parsed.database or ''}"


def ledger_unavailable(
    url: str, what: str, attempts: int, elapsed: float, cause: BaseException
) -> PipelineError:
    """The typed error of an outage longer than the retry budget."""
    parsed = sa.engine.make_url(url)
    driver = _driver_error(cause)
    text = one_line(str(driver).split("\n", 1)[0], 300)  # not the SQL that follows
    if parsed.password:  # a driver never echoes it, but nothing of ours may either
        text = text.replace(str(parsed.password), "***")
    server = server_name(url)
    return PipelineError(
        ErrorCode.LEDGER_UNAVAILABLE,
        f"the ledger database {server} is unreachable: {what} failed {attempts} times over "
        f"{elapsed:.1f}s ({type(driver).__name__}: {text}); the step's lease lapses on its "
        "own, resume once the server is back",
        details={"server": server, "operation": what, "attempts": attempts},
    )


class Once(Generic[T]):
    """A side effect run inside a ledger transaction (a checkpoint rename under the row
    lock): a retry of the transaction after a dropped commit must not run it twice.

    ``__call__`` runs it on the first call and returns the same result after; a call that
    failed part-way marks it ``interrupted``, and an interrupted unit is never retried.
    """

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._started = False
        self._done = False
        self._value: T | None = None

    @property
    def done(self) -> bool:
        return self._done

    @property
    def interrupted(self) -> bool:
        return self._started and not self._done

    def __call__(self) -> T:
        if not self._done:
            self._started = True
            self._value = self._fn()
            self._done = True
        return self._value  # type: ignore[return-value]


def retry_dropped(
    body: Callable[[int], T],
    *,
    url: str,
    what: str,
    callbacks: Sequence[Once[Any]] = (),
    pauses: Sequence[float] | None = None,
) -> T:
    """``body(attempt)`` (attempt 1, 2, ...), re-run whole while the connection drops.

    ``body`` opens its own connection and transaction each time. It gets the attempt
    number so that a non-idempotent write can first look for its own earlier success.
    ``callbacks``: side effects ``body`` runs (see :class:`Once`).
    """
    schedule = RETRY_PAUSES_SECONDS if pauses is None else tuple(pauses)
    started = time.monotonic()
    attempt = 1
    while True:
        try:
            return body(attempt)
        except Exception as exc:
            if not is_dropped_connection(exc) or any(c.interrupted for c in callbacks):
                raise
            if attempt > len(schedule):
                raise ledger_unavailable(
                    url, what, attempt, time.monotonic() - started, exc
                ) from exc
            pause = schedule[attempt - 1]
            log.warning(
                "ledger %s: connection lost during %s (%s); attempt %d in %.1fs",
                server_name(url),
                what,
                type(_driver_error(exc)).__name__,
                attempt + 1,
                pause,
            )
            time.sleep(pause)
            attempt += 1
