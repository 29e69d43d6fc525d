"""The ledger's engines: one pooled engine per URL and process, each dialect set up once.

SQLite takes its transaction control from pysqlite (writes start with BEGIN IMMEDIATE) and
its pragmas on connect; PostgreSQL sessions are named and their connection attempts bounded.
"""

import os
import sqlite3
import threading
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

_ENGINES: dict[tuple[str, int], Engine] = {}
_ENGINES_LOCK = threading.Lock()
# How the PostgreSQL ledger's sessions are named (pg_stat_activity.application_name).
APPLICATION_NAME = "storyboard-ledger"
# One connection attempt's limit (seconds): a refused connection fails at once, this only
# bounds a host that does not answer at all.
CONNECT_TIMEOUT_SECONDS = 10


def _sqlite_events(engine: Engine) -> None:
    """Take transaction control from pysqlite: writes start with BEGIN IMMEDIATE.

    An immediate transaction takes SQLite's write lock up front, which is what makes a
    publish "under the row lock" on SQLite and avoids lock-upgrade deadlocks.
    """

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout=60000")
        # Switching a new file to WAL answers "locked" at once (the busy timeout does not
        # apply) while another connection does the same; retry instead of failing start-up.
        deadline = time.monotonic() + 60
        while True:
            try:
                cursor.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        mode = "DEFERRED" if conn.get_execution_options().get("read_only") else "IMMEDIATE"
        conn.exec_driver_sql(f"BEGIN {mode}")


def _pg_connect_args(url: str) -> dict[str, Any]:
    """Name our sessions and bound a connection attempt, unless the URL says otherwise.

    ``application_name`` (``storyboard-ledger:<pid>``) lets an operator, or a test, find
    this process's sessions in ``pg_stat_activity``. ``connect_timeout``: without it a
    connection attempt to an unreachable host waits for the OS TCP timeout (minutes),
    which would make the bounded retry of a dropped connection unbounded.
    """
    query = sa.engine.make_url(url).query
    args: dict[str, Any] = {}
    if "application_name" not in query:
        args["application_name"] = f"{APPLICATION_NAME}:{os.getpid()}"
    if "connect_timeout" not in query:
        args["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    return args


def engine_for(url: str) -> Engine:
    """One pooled engine per URL and process, created on first use (never at import)."""
    key = (url, os.getpid())
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            if url.startswith("sqlite"):
                engine = sa.create_engine(
                    url, connect_args={"timeout": 60, "check_same_thread": False}
                )
                _sqlite_events(engine)
            else:
                # No pre-ping: it would add a round trip to every operation of the claim
                # path. A pooled connection the server dropped fails its first statement
                # before the server runs anything, SQLAlchemy then invalidates the whole
                # pool, and the store re-runs the operation on a fresh connection
                # (resources.ledger.retry): the same recovery, paid only after a blip.
                engine = sa.create_engine(
                    url,
                    pool_recycle=1800,
                    pool_size=5,
                    max_overflow=10,
                    connect_args=_pg_connect_args(url),
                )
            _ENGINES[key] = engine
        return engine
