"""The ledger store: the only place that speaks SQL to the ledger.

Every operation is a short transaction of its own: no connection or transaction is held
while a step body runs. The same statements run on PostgreSQL and SQLite.
"""

import functools
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.settings import validate_ledger_values
from pipeline_defs.resume.status import SETTLED_RESULT, TERMINAL_STATUSES, LedgerRow, StepStatus
from resources.ledger import pointers
from resources.ledger.audit import Audit, write_audit
from resources.ledger.retry import Once, is_dropped_connection, retry_dropped
from resources.ledger.tables import (
    provider_call,
    setting_change,
    settings,
    step_run,
    step_transition,
)
from resources.ledger.transitions import status_guard

T = TypeVar("T")
# A result row as the mapping it is (SQLAlchemy types RowMapping's keys wider than str).
_Mapping = Mapping[str, Any]
_STATUS_TEXTS = tuple(s.value for s in StepStatus)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"

# ``claim(seen=...)`` default: no compare-and-set (operators and benchmarks claim blind).
NOT_JUDGED = object()

_ENGINES: dict[tuple[str, int], Engine] = {}
_ENGINES_LOCK = threading.Lock()
# get_many filters up to this many (project, episode) pairs in SQL, more in Python.
_PAIR_FILTER_LIMIT = 500
# How stale a process's copy of the settings table may be: a run's steps and a sensor's tick
# read it at most once per this many seconds, and a change applies everywhere within it.
SETTINGS_MAX_AGE_SECONDS = 5.0
# How the PostgreSQL ledger's sessions are named (pg_stat_activity.application_name).
APPLICATION_NAME = "storyboard-ledger"
# One connection attempt's limit (seconds): a refused connection fails at once, this only
# bounds a host that does not answer at all.
CONNECT_TIMEOUT_SECONDS = 10


def _now() -> str:
    return format_timestamp(datetime.now(UTC))


def lock_owner() -> str:
    """Diagnostic owner text: which host and process holds a claim."""
    return f"{socket.gethostname()}/{os.getpid()}"


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


def _row(mapping: Mapping[str, Any] | None) -> LedgerRow | None:
    return LedgerRow.from_row(mapping) if mapping is not None else None


# ---------------------------------------------------------------------- prebuilt statements
# The per-step operations (claim, transition, audit) run for every step of every run. Each
# statement shape is built once with bind parameters: building and cache-keying a Core
# statement per call cost ~0.65 ms of client CPU per claim + transition, more than the round
# trips. SQLAlchemy still compiles each shape once per dialect and reuses it.
_B = sa.bindparam


def _key_params(key: StepKey) -> dict[str, str]:
    return {"k_project": key.project_id, "k_episode": key.episode_id, "k_step": key.step_id}


_KEY_WHERE = sa.and_(
    step_run.c.project_id == _B("k_project"),
    step_run.c.episode_id == _B("k_episode"),
    step_run.c.step_id == _B("k_step"),
)
_OWNED_WHERE = sa.and_(_KEY_WHERE, step_run.c.run_id == _B("k_mine"))


@functools.cache
def _claim_statement(on_sqlite: bool, seen: str, steal: bool, auto: bool, beat: bool) -> Any:
    """The claim upsert of docs/DESIGN.md#claims for one shape.

    ``seen``: "any" (no compare-and-set), "none" (the judge saw no row: only the insert may
    win) or "row" (the row must still have the run_id / updated_at the judge read);
    ``steal``: a stale running row may be taken over if started_at and run_id are still the
    texts the judge read; ``auto``: an automatic recovery (counted, reason recorded);
    ``beat``: the steal also needs heartbeat_at to be the text the judge read (an owner
    that renewed its lease since is alive).
    """
    insert = (sqlite.insert if on_sqlite else postgresql.insert)(step_run).values(
        id=_B("c_id"),
        project_id=_B("k_project"),
        episode_id=_B("k_episode"),
        step_id=_B("k_step"),
        status=StepStatus.RUNNING.value,
        run_id=_B("c_run_id"),
        started_at=_B("c_ts"),
        created_at=_B("c_ts"),
        updated_at=_B("c_ts"),
        heartbeat_at=_B("c_ts"),
        lock_owner=_B("c_owner"),
        recovery_count=1 if auto else 0,
        last_recovery_reason=_B("c_reason") if auto else None,
    )
    may_take: sa.ColumnElement[bool] = status_guard("claim")  # docs/DESIGN.md#status-transitions
    if seen == "none":
        may_take = sa.false()
    elif seen == "row":
        may_take = sa.and_(
            may_take,
            step_run.c.run_id.is_not_distinct_from(_B("c_seen_run_id", type_=sa.String)),
            step_run.c.updated_at == _B("c_seen_updated_at", type_=sa.Text),
        )
    if steal:  # a NULL started_at is never stealable: the caller only asks with both texts
        may_take = sa.or_(
            may_take,
            sa.and_(
                status_guard("steal"),
                step_run.c.started_at == _B("c_expected_started_at", type_=sa.Text),
                step_run.c.run_id == _B("c_expected_run_id", type_=sa.String),
                step_run.c.heartbeat_at == _B("c_expected_heartbeat_at", type_=sa.Text)
                if beat
                else sa.true(),
            ),
        )
    update: dict[str, Any] = {
        "run_id": _B("c_run_id"),
        "status": StepStatus.RUNNING.value,
        "started_at": _B("c_ts"),
        "updated_at": _B("c_ts"),
        "heartbeat_at": _B("c_ts"),
        "lock_owner": _B("c_owner"),
        "completed_at": None,
        "error_message": None,
        "checkpoint_seal": None,
        "recovery_count": step_run.c.recovery_count + (1 if auto else 0),
    }
    if auto:
        update["last_recovery_reason"] = _B("c_reason")
    return insert.on_conflict_do_update(
        index_elements=[step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id],
        set_=update,
        where=may_take,
    ).returning(step_run.c.run_id)


@functools.cache
def _transition_statement(columns: tuple[str, ...], owned: bool) -> Any:
    """UPDATE of ``columns`` (bound as ``v_<column>``) on the key's row (owner-aware)."""
    return (
        sa.update(step_run)
        .where(_OWNED_WHERE if owned else _KEY_WHERE)
        .values({column: _B(f"v_{column}") for column in columns})
    )


@functools.cache
def _lock_statement(owned: bool) -> Any:
    return sa.select(step_run.c.id).where(_OWNED_WHERE if owned else _KEY_WHERE).with_for_update()


# The next provider_call id on PostgreSQL (drawn before the insert: see start_provider_call).
_NEXT_CALL_ID = sa.select(
    sa.func.nextval(sa.func.pg_get_serial_sequence(provider_call.name, provider_call.c.id.name))
)


class LedgerStore:
    """Named ledger operations over SQLAlchemy Core. ``step_run`` rows come back as
    :class:`LedgerRow` (built here, once); audit and cost rows as plain dicts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._migrated = False
        self._settings_cache: tuple[float, dict[str, str]] | None = None

    # ----------------------------------------------------------------- plumbing
    @property
    def engine(self) -> Engine:
        return engine_for(self.url)

    @property
    def is_sqlite(self) -> bool:
        """From the URL, as ``engine_for`` decides: no engine lookup on the claim path."""
        return self.url.startswith("sqlite")

    def _insert(self) -> Any:
        return (sqlite.insert if self.is_sqlite else postgresql.insert)(step_run)

    def _write(self) -> Any:
        """A short write transaction (BEGIN IMMEDIATE on SQLite)."""
        self.ensure_schema()
        return self.engine.begin()

    def _single(self) -> Any:
        """One self-contained statement: autocommit on PostgreSQL (one round trip instead
        of BEGIN/statement/COMMIT), an immediate transaction on SQLite."""
        self.ensure_schema()
        if self.is_sqlite:
            return self.engine.begin()
        return self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    def _read(self) -> Any:
        self.ensure_schema()
        if self.is_sqlite:
            return self.engine.connect().execution_options(read_only=True)
        return self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    # Every operation below runs as ``body(attempt)`` through :meth:`_retry`: one whole unit
    # of work (connection, transaction, statements, commit) that PostgreSQL may make run
    # again after a dropped connection (resources.ledger.retry). A write whose effect is
    # not the same when run twice looks for its own earlier success on ``attempt > 1``.
    def _retry(
        self,
        what: str,
        body: Callable[[int], T],
        *,
        callbacks: Sequence[Once[Any]] = (),
    ) -> T:
        if self.is_sqlite:  # embedded: no server to lose; "database is locked" is no blip
            return body(1)
        return retry_dropped(body, url=self.url, what=what, callbacks=callbacks)

    def _in_single(self, what: str, fn: Callable[[Connection], T]) -> T:
        """One statement whose second run changes nothing more (fixed values, owner-aware)."""

        def body(_attempt: int) -> T:
            with self._single() as conn:
                return fn(conn)

        return self._retry(what, body)

    def _in_read(self, what: str, fn: Callable[[Connection], T]) -> T:
        def body(_attempt: int) -> T:
            with self._read() as conn:
                return fn(conn)

        return self._retry(what, body)

    @staticmethod
    def _key_clause(key: StepKey) -> sa.ColumnElement[bool]:
        return sa.and_(
            step_run.c.project_id == key.project_id,
            step_run.c.episode_id == key.episode_id,
            step_run.c.step_id == key.step_id,
        )

    def migrate(self) -> str:
        """Bring the database to the head revision; returns the revision."""
        return self._retry("migrate", lambda _attempt: self._migrate())

    def _migrate(self) -> str:
        """:meth:`migrate` without the retry (run inside an operation that retries)."""
        from alembic import command
        from alembic.config import Config
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        head = ScriptDirectory.from_config(cfg).get_current_head()
        with self.engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
        if current != head:
            try:
                with self.engine.begin() as conn:
                    cfg.attributes["connection"] = conn
                    command.upgrade(cfg, "head")
            except sa.exc.DBAPIError as exc:
                if is_dropped_connection(exc):
                    raise  # not a concurrent migration: the caller's retry runs it again
                # A concurrent process may have migrated first; accept it if it reached head.
                with self.engine.connect() as conn:
                    if MigrationContext.configure(conn).get_current_revision() != head:
                        raise
        self._migrated = True
        return str(head)

    def ensure_schema(self) -> None:
        """Migrate on first use; called inside every operation, so inside its retry."""
        if not self._migrated:
            self._migrate()

    # ----------------------------------------------------------------- settings
    def stored_settings(self, max_age: float = SETTINGS_MAX_AGE_SECONDS) -> dict[str, str]:
        """The ledger's settings table (key -> value), read at most every ``max_age`` s.

        Read without migrating: read-only commands must not write schema, and a ledger that
        does not exist yet (or predates the table) holds no settings. A database that
        cannot be reached still fails.
        """
        cached = self._settings_cache
        if cached is not None and time.monotonic() - cached[0] < max_age:
            return dict(cached[1])
        values = self._retry("read settings", lambda _attempt: self._read_settings())
        self._settings_cache = (time.monotonic(), values)
        return dict(values)

    def _read_settings(self) -> dict[str, str]:
        if self.is_sqlite:
            database = sa.engine.make_url(self.url).database or ""
            if database in ("", ":memory:") or not Path(database).is_file():
                return {}  # connecting would create the file
        query = sa.select(settings.c.key, settings.c.value)
        try:
            if self.is_sqlite:
                conn = self.engine.connect().execution_options(read_only=True)
            else:
                conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            with conn:
                return {str(k): str(v) for k, v in conn.execute(query).all()}
        except sa.exc.DBAPIError as exc:
            if is_dropped_connection(exc):
                raise  # the server, not the table, is missing: retried whole
            with self.engine.connect() as conn:
                if sa.inspect(conn).has_table(settings.name):
                    raise
            return {}  # not migrated to 0004 yet

    def set_setting(self, key: str, value: str, *, changed_by: str) -> tuple[str | None, str]:
        """Set one setting (validated with the whole table) and audit it: ``(old, new)``.

        A refused value raises ``settings.invalid`` naming the key and writes nothing.
        """
        changes = self._change_settings({key: value}, changed_by={key: changed_by}, keep=False)
        current = self.stored_settings(max_age=0)
        return changes.get(key, (current.get(key), current.get(key, value)))

    def seed_settings(
        self, values: Mapping[str, str], *, changed_by: Mapping[str, str]
    ) -> dict[str, tuple[str | None, str]]:
        """Insert the keys the table does not hold yet; a value already there is kept (an
        operator's ``settings set`` is never overwritten by a later seed)."""
        return self._change_settings(values, changed_by=changed_by, keep=True)

    def _change_settings(
        self, values: Mapping[str, str], *, changed_by: Mapping[str, str], keep: bool
    ) -> dict[str, tuple[str | None, str]]:
        # Run again after a dropped commit, the unit re-reads the table and writes only what
        # still differs: nothing twice (a change whose commit was lost and yet applied is
        # then reported as no change).
        def body(_attempt: int) -> dict[str, tuple[str | None, str]]:
            with self._write() as conn:
                return self._apply_settings(conn, values, changed_by=changed_by, keep=keep)

        changes = self._retry("change settings", body)
        self._settings_cache = None  # this process sees its own change at once
        return changes

    def _apply_settings(
        self,
        conn: Connection,
        values: Mapping[str, str],
        *,
        changed_by: Mapping[str, str],
        keep: bool,
    ) -> dict[str, tuple[str | None, str]]:
        changes: dict[str, tuple[str | None, str]] = {}
        if not self.is_sqlite:
            # Serialize changes: two keys validated apart (lease, heartbeat) could make
            # a pair neither change alone would allow. SQLite's BEGIN IMMEDIATE does this.
            conn.exec_driver_sql("LOCK TABLE settings IN SHARE ROW EXCLUSIVE MODE")
        rows = conn.execute(sa.select(settings.c.key, settings.c.value)).all()
        current = {str(k): str(v) for k, v in rows}
        wanted = {k: v for k, v in values.items() if not (keep and k in current)}
        merged = validate_ledger_values({**current, **wanted})  # raises: nothing written
        now = _now()
        for key in wanted:
            old, new = current.get(key), merged[key]
            if old == new:
                continue
            row = {"value": new, "updated_at": now, "updated_by": changed_by[key]}
            if old is None:
                conn.execute(sa.insert(settings).values(key=key, **row))
            else:
                conn.execute(sa.update(settings).where(settings.c.key == key).values(**row))
            conn.execute(
                sa.insert(setting_change).values(
                    key=key,
                    old_value=old,
                    new_value=new,
                    changed_at=now,
                    changed_by=changed_by[key],
                )
            )
            changes[key] = (old, new)
        return changes

    def setting_changes(self) -> list[dict[str, Any]]:
        """The audit trail of the settings table, oldest first."""
        query = sa.select(setting_change).order_by(setting_change.c.id)
        return self._in_read(
            "read setting changes",
            lambda conn: [dict(r) for r in conn.execute(query).mappings()],
        )

    # ----------------------------------------------------------------- reads
    def get(self, key: StepKey) -> LedgerRow | None:
        query = sa.select(step_run).where(self._key_clause(key))
        return self._in_read(
            "read a step row",
            lambda conn: _row(cast(_Mapping, conn.execute(query).mappings().first())),
        )

    def get_many(
        self,
        *,
        episodes: Iterable[Episode] | None = None,
        step_ids: Iterable[str] | None = None,
        changed_since: tuple[int, str] | None = None,
        columns: Sequence[str] | None = None,
    ) -> dict[StepKey, LedgerRow]:
        """All rows (optionally of some episodes/steps) in ONE query, keyed by StepKey.

        With ``changed_since=(transition_seq, updated_at)`` (a :meth:`cursor` value, its
        text moved back by the caller to absorb clock skew) it returns instead every row of
        the partitions touched since then (a row with ``updated_at >=`` that text, or an
        audit row after that seq) plus every row of ``episodes``; still one query, text
        comparison only (never cast). ``columns``: fetch only these (plus the key), for bulk
        readers such as the sensor (a cold tick reads every row of the ledger).
        """
        if columns is None:
            query = sa.select(step_run)
        else:
            names = dict.fromkeys(("project_id", "episode_id", "step_id", *columns))
            query = sa.select(*(step_run.c[name] for name in names))
        if step_ids is not None:
            query = query.where(step_run.c.step_id.in_(list(step_ids)))
        pair = sa.tuple_(step_run.c.project_id, step_run.c.episode_id)
        listed = sorted({(e.project_id, e.episode_id) for e in episodes or ()})
        wanted: set[tuple[str, str]] | None = None
        if changed_since is not None:
            seq, since = changed_since
            touched = sa.union(
                sa.select(step_run.c.project_id, step_run.c.episode_id).where(
                    step_run.c.updated_at >= since
                ),
                sa.select(step_transition.c.project_id, step_transition.c.episode_id).where(
                    step_transition.c.transition_seq > seq
                ),
            ).subquery()
            clause = pair.in_(sa.select(touched.c.project_id, touched.c.episode_id))
            query = query.where(sa.or_(clause, pair.in_(listed)) if listed else clause)
        elif episodes is not None:
            wanted = set(listed)
            if len(listed) <= _PAIR_FILTER_LIMIT:
                query = query.where(pair.in_(listed))
            else:
                projects = sorted({p for p, _ in wanted})
                query = query.where(step_run.c.project_id.in_(projects))

        def fetch(conn: Connection) -> tuple[list[str], list[Sequence[Any]]]:
            result = conn.execute(query)
            return list(result.keys()), list(result.all())

        labels, fetched = self._in_read("read step rows", fetch)
        out: dict[StepKey, LedgerRow] = {}
        for values in fetched:
            row = dict(zip(labels, values, strict=True))
            if wanted is not None and (row["project_id"], row["episode_id"]) not in wanted:
                continue
            key = StepKey(row["project_id"], row["episode_id"], row["step_id"])
            out[key] = LedgerRow.from_row(row)
        return out

    def running_rows(self) -> list[LedgerRow]:
        query = sa.select(step_run).where(step_run.c.status == StepStatus.RUNNING.value)
        return self._in_read(
            "read running rows",
            lambda conn: [
                LedgerRow.from_row(cast(_Mapping, r)) for r in conn.execute(query).mappings()
            ],
        )

    def cursor(self) -> tuple[int, str]:
        """(highest transition_seq, latest updated_at): changes when any row or audit changes."""

        def read(conn: Connection) -> tuple[int, str]:
            seq = conn.execute(sa.select(sa.func.max(step_transition.c.transition_seq))).scalar()
            updated = conn.execute(sa.select(sa.func.max(step_run.c.updated_at))).scalar()
            return int(seq or 0), str(updated or "")

        return self._in_read("read the ledger cursor", read)

    def transitions(
        self, key: StepKey | None = None, *, since_seq: int = 0
    ) -> list[dict[str, Any]]:
        query = sa.select(step_transition).where(step_transition.c.transition_seq > since_seq)
        if key is not None:
            query = query.where(
                step_transition.c.project_id == key.project_id,
                step_transition.c.episode_id == key.episode_id,
                step_transition.c.step_id == key.step_id,
            )
        ordered = query.order_by(step_transition.c.transition_seq)
        return self._in_read(
            "read transitions", lambda conn: [dict(r) for r in conn.execute(ordered).mappings()]
        )

    def provider_calls(
        self,
        key: StepKey | None = None,
        *,
        run_id: str | None = None,
        episode: Episode | None = None,
    ) -> list[dict[str, Any]]:
        query = sa.select(provider_call)
        if key is not None:
            episode = key.episode
            query = query.where(provider_call.c.step_id == key.step_id)
        if episode is not None:
            query = query.where(
                provider_call.c.project_id == episode.project_id,
                provider_call.c.episode_id == episode.episode_id,
            )
        if run_id is not None:
            query = query.where(provider_call.c.run_id == run_id)
        ordered = query.order_by(provider_call.c.id)
        return self._in_read(
            "read provider calls", lambda conn: [dict(r) for r in conn.execute(ordered).mappings()]
        )

    # ----------------------------------------------------------------- claims
    def claim(
        self,
        key: StepKey,
        run_id: str,
        *,
        allow_stale_steal: bool = False,
        expected_started_at: str | None = None,
        expected_run_id: str | None = None,
        expected_heartbeat_at: str | None = None,
        auto_recovery: bool = False,
        reason: str | None = None,
        now: str | None = None,
        seen: LedgerRow | Mapping[str, Any] | object | None = NOT_JUDGED,
        audit: Audit | None = None,
        refused: Audit | None = None,
    ) -> bool:
        """One atomic upsert: take the row unless another owner is running it.

        ``audit`` / ``refused``: the history line of a won / lost claim, written in the
        same transaction as the upsert (docs/DESIGN.md#audit).

        A running row is only taken over (``allow_stale_steal``) when its started_at and
        run_id (and, when given, heartbeat_at) are still exactly the texts the judge read.
        With ``seen`` (the row the judge
        read, or None for "no row") the claim is also a compare-and-set on that state: a
        run that judged a row which another run has since claimed, finished or failed
        wins nothing, so a step never executes twice for one judgement.
        Success = a row came back.
        """
        ts = now or _now()
        shape = "any" if seen is NOT_JUDGED else "none" if seen is None else "row"
        steal = (
            allow_stale_steal and expected_started_at is not None and expected_run_id is not None
        )
        params: dict[str, Any] = {
            **_key_params(key),
            "c_id": str(uuid.uuid4()),
            "c_run_id": run_id,
            "c_ts": ts,
            "c_owner": lock_owner(),
        }
        if auto_recovery:
            params["c_reason"] = reason
        if shape == "row":
            seen_row = LedgerRow.of(seen)  # type: ignore[arg-type]
            assert seen_row is not None
            params["c_seen_run_id"] = seen_row.run_id
            params["c_seen_updated_at"] = seen_row.updated_at
        beat = steal and expected_heartbeat_at is not None
        if steal:
            params["c_expected_started_at"] = expected_started_at
            params["c_expected_run_id"] = expected_run_id
        if beat:
            params["c_expected_heartbeat_at"] = expected_heartbeat_at
        statement = _claim_statement(self.is_sqlite, shape, steal, auto_recovery, beat)

        audited = audit is not None or refused is not None

        def body(attempt: int) -> bool:
            with self._write() if audited else self._single() as conn:
                # A retry after a dropped connection: the first attempt may have committed
                # (its answer lost). The row then names this run_id (unique per claim) and
                # this claim's started_at: that is our win, not another owner's row.
                if attempt > 1 and self._row_is(
                    conn, key, run_id=run_id, status=StepStatus.RUNNING, started_at=ts
                ):
                    return True
                found = conn.execute(statement, params).first()
                won = found is not None and found[0] == run_id
                line = audit if won else refused
                if line is not None:
                    write_audit(conn, key, line, ts, attempt=attempt)
            return won

        return self._retry("claim", body)

    def _row_is(self, conn: Connection, key: StepKey, **expected: Any) -> bool:
        """Whether the key's row exists with exactly these column values (after an unknown
        outcome: did our own write land?)."""
        columns = [step_run.c[name] for name in expected]
        found = conn.execute(sa.select(*columns).where(self._key_clause(key))).first()
        return found is not None and all(
            value == want for value, want in zip(found, expected.values(), strict=True)
        )

    def _settled_insert(
        self, key: StepKey, run_id: str, status: StepStatus, summary: str, ts: str
    ) -> Any:
        """INSERT of a finished row (adoption, not-applicable) with every NOT NULL column."""
        return self._insert().values(
            id=str(uuid.uuid4()),
            project_id=key.project_id,
            episode_id=key.episode_id,
            step_id=key.step_id,
            status=status.value,
            run_id=run_id,
            result_summary=summary,
            completed_at=ts,
            created_at=ts,
            updated_at=ts,
            recovery_count=0,
        )

    def adopt(
        self,
        key: StepKey,
        run_id: str,
        *,
        summary: str,
        seal: str | None = None,
        now: str | None = None,
        audit: Audit | None = None,
    ) -> bool:
        """Record a verified orphan checkpoint as completed; never overwrites an existing row.

        ``seal``: the adopting run verified it clean, so the row can carry its seal;
        ``audit``: its history line, in the same transaction.
        """
        ts = now or _now()
        statement = self._settled_insert(key, run_id, StepStatus.COMPLETED, summary, ts)
        statement = (
            statement.values(checkpoint_seal=seal)
            .on_conflict_do_nothing(
                index_elements=[step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id]
            )
            .returning(step_run.c.id)
        )

        def body(attempt: int) -> bool:
            with self._write() if audit is not None else self._single() as conn:
                # After a lost answer, our own insert is the row with our run and timestamp.
                if attempt > 1 and self._row_is(
                    conn, key, run_id=run_id, status=StepStatus.COMPLETED, created_at=ts
                ):
                    return True
                done = conn.execute(statement).first() is not None
                if done and audit is not None:
                    write_audit(conn, key, audit, ts, attempt=attempt)
                return done

        return self._retry("adopt", body)

    def mark_not_applicable(
        self,
        key: StepKey,
        run_id: str,
        reason: str,
        now: str | None = None,
        *,
        audit: Audit | None = None,
    ) -> bool:
        """Record that the step does not apply here; never touches a running row.
        ``audit``: its history line, in the same transaction."""
        ts = now or _now()
        statement = (
            self._settled_insert(key, run_id, StepStatus.NOT_APPLICABLE, reason, ts)
            .on_conflict_do_update(
                index_elements=[step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id],
                set_={
                    "status": StepStatus.NOT_APPLICABLE.value,
                    "run_id": run_id,
                    "result_summary": reason,
                    "completed_at": ts,
                    "updated_at": ts,
                    "error_message": None,
                },
                where=status_guard("mark_not_applicable"),
            )
            .returning(step_run.c.id)
        )

        # Run again after a lost answer, the upsert finds our not-applicable row (not
        # running) and writes the same values: the same answer.
        def body(attempt: int) -> bool:
            with self._write() if audit is not None else self._single() as conn:
                done = conn.execute(statement).first() is not None
                if done and audit is not None:
                    write_audit(conn, key, audit, ts, attempt=attempt)
                return done

        return self._retry("mark not applicable", body)

    # ----------------------------------------------------------------- owner-aware writes
    def _owned(self, key: StepKey, run_id: str) -> sa.ColumnElement[bool]:
        return sa.and_(self._key_clause(key), step_run.c.run_id == run_id)

    def transition(
        self,
        key: StepKey,
        run_id: str,
        status: StepStatus | str,
        *,
        require_owner: bool = True,
        applicable_count: int | None = None,
        completed_count: int | None = None,
        failed_count: int | None = None,
        error: str | None = None,
        summary: str | None = None,
        resolved_model: str | None = None,
        input_hash: str | None = None,
        publish: Callable[[], Any] | None = None,
        seal: str | None = None,
        pointer: str | None = None,
        keep_archives: int = 5,
        now: str | None = None,
        audit: Audit | None = None,
        refused: Audit | None = None,
    ) -> bool:
        """Move the row to ``status`` if this run still owns it.

        ``audit``: the history line of the change, committed with it; ``refused``: the line
        recorded instead when the row no longer names this owner (docs/DESIGN.md#audit).

        ``pointer`` (object storage): the manifest of the checkpoint this transition
        publishes, stored on the locked row in the same transaction as the status; the
        pointer it replaces goes to ``checkpoint_archive`` (newest ``keep_archives`` kept).
        A worker that lost the row publishes nothing: its objects stay in its own attempt.

        ``seal`` (resources.checkpoints.seal) describes the clean checkpoint this transition
        publishes or keeps; every transition writes it, so any other status clears it.

        With ``publish`` the owner's row is locked first, the status written, ``publish``
        run (the checkpoint rename) and everything committed together, so a worker whose
        lease was stolen can neither record a status nor replace the newer checkpoint.
        Returns False (and runs nothing) when the row no longer names this owner.
        """
        if status not in _STATUS_TEXTS:  # the CHECK constraint would refuse it mid-transaction
            raise PipelineError(
                "input.invalid",
                f"{key}: {status!r} is not a step status (one of {', '.join(_STATUS_TEXTS)})",
            )
        status = StepStatus(status)
        ts = now or _now()
        values: dict[str, Any] = {
            "status": status.value,
            "updated_at": ts,
            "error_message": error,
            "checkpoint_seal": seal,
        }
        for column, value in (
            ("applicable_count", applicable_count),
            ("completed_count", completed_count),
            ("failed_count", failed_count),
            ("result_summary", summary),
            ("resolved_model", resolved_model),
            ("input_hash", input_hash),
        ):
            if value is not None:
                values[column] = value
        if status in TERMINAL_STATUSES:
            values["completed_at"] = ts
        params: dict[str, Any] = {**_key_params(key), "k_mine": run_id}
        params.update({f"v_{column}": value for column, value in values.items()})
        statement = _transition_statement(tuple(sorted(values)), require_owner)
        # Retried after a dropped connection, the unit writes the same values (``ts``
        # included) where the row still names this owner: a commit that did land is
        # simply confirmed. ``publish`` (the checkpoint rename) runs at most once: a retry
        # after it ran re-takes the row lock, re-checks the owner and commits. A rename
        # cannot be taken back; a session lost while it ran leaves the window that a lost
        # commit always left (another run could only take the row after our lease lapsed).
        once = Once(publish) if publish is not None else None

        def body(attempt: int) -> bool:
            with self._write() as conn:
                if once is not None or pointer is not None:
                    locked = conn.execute(_lock_statement(require_owner), params).first()
                    if locked is None:
                        if refused is not None:
                            write_audit(conn, key, refused, ts, attempt=attempt)
                        return False
                previous = pointers.current_pointer(conn, key) if pointer is not None else None
                changed = conn.execute(statement, params).rowcount
                if changed != 1:
                    if refused is not None:
                        write_audit(conn, key, refused, ts, attempt=attempt)
                    return False
                if audit is not None:
                    write_audit(conn, key, audit, ts, attempt=attempt)
                if pointer is not None:  # a retry finds its own pointer: nothing archived
                    pointers.set_pointer(
                        conn,
                        key,
                        pointer,
                        previous=previous,
                        reason="replaced",
                        run_id=run_id,
                        keep=keep_archives,
                        now=ts,
                    )
                if once is not None:
                    once()
            return True

        return self._retry("transition", body, callbacks=(once,) if once else ())

    def publish(
        self,
        key: StepKey,
        run_id: str,
        fn: Callable[[], T],
        *,
        pointer: str | None = None,
        keep_archives: int = 5,
    ) -> T:
        """Run ``fn`` while holding the row lock of a row that still names this owner.

        After a dropped connection the lock is taken again; ``fn`` runs at most once (a
        retry after it ran only re-checks the owner and returns its result). ``pointer``
        (object storage): the manifest this publishes, stored in the same transaction.
        """
        once = Once(fn)
        ts = _now()

        def body(_attempt: int) -> T:
            with self._write() as conn:
                locked = conn.execute(
                    sa.select(step_run.c.id).where(self._owned(key, run_id)).with_for_update()
                ).first()
                if locked is None:
                    raise PipelineError(
                        "step.ownership_lost",
                        f"{key}: run {run_id} no longer owns the ledger row; refusing to publish",
                    )
                if pointer is not None:
                    pointers.replace_pointer(
                        conn,
                        key,
                        pointer,
                        reason="replaced",
                        run_id=run_id,
                        keep=keep_archives,
                        now=ts,
                    )
                return once()

        return self._retry("publish", body, callbacks=(once,))

    def swap_pointer(
        self,
        key: StepKey,
        *,
        expected: str,
        pointer: str,
        run_id: str | None,
        reason: str = "mutation",
        keep_archives: int = 5,
        now: str | None = None,
    ) -> bool:
        """Compare-and-set of a settled row's commit pointer (a mutator's edit of a victim
        on object storage): applied only while the row is not running and still publishes
        ``expected``; the replaced pointer is archived. A retry after a lost answer finds
        its own pointer in place and reports success."""
        ts = now or _now()

        def body(attempt: int) -> bool:
            with self._write() as conn:
                if attempt > 1 and pointers.current_pointer(conn, key) == pointer:
                    return True
                return pointers.swap_pointer(
                    conn,
                    key,
                    expected=expected,
                    pointer=pointer,
                    reason=reason,
                    run_id=run_id,
                    keep=keep_archives,
                    now=ts,
                )

        return self._retry("swap a commit pointer", body)

    def adopt_pointer(self, key: StepKey, pointer: str, now: str | None = None) -> bool:
        """First pointer of a settled row that has none (``storyboard storage migrate``);
        False when the row is running, absent or already publishes one. Idempotent."""
        ts = now or _now()

        def body(attempt: int) -> bool:
            with self._write() as conn:
                if attempt > 1 and pointers.current_pointer(conn, key) == pointer:
                    return True
                return pointers.adopt_pointer(conn, key, pointer, now=ts)

        return self._retry("adopt a commit pointer", body)

    def clear_seal(self, key: StepKey, seal: str, now: str | None = None) -> bool:
        """Drop ``seal`` from ``key``'s row while it still carries it (a scrub found the
        storage drifted from it); False when the row holds another seal by now."""
        ts = now or _now()

        def body(attempt: int) -> bool:
            with self._write() as conn:
                return pointers.clear_seal(conn, key, seal, now=ts)

        return self._retry("clear a seal", body)

    def clear_episode_seals(self, project_id: str, episode_id: str) -> int:
        """Drop every seal of one episode's rows (its inputs were replaced)."""
        ts = _now()

        def body(attempt: int) -> int:
            with self._write() as conn:
                return pointers.clear_episode_seals(conn, project_id, episode_id, now=ts)

        return self._retry("clear an episode's seals", body)

    def archived_pointers(self, key: StepKey) -> list[str]:
        """The step's replaced commit pointers, newest first."""
        return self._in_read(
            "read archived pointers", lambda conn: pointers.archived_pointers(conn, key)
        )

    def references(self) -> pointers.References:
        """Every commit pointer (current and archived) and every claim: what object-storage
        garbage collection must keep."""
        return self._in_read("read references", pointers.referenced)

    def with_settled_row(
        self,
        key: StepKey,
        fn: Callable[[], T],
        *,
        reseal: bool = False,
        seal: str | None = None,
        pointer: str | None = None,
        reason: str = "mutation",
        run_id: str | None = None,
        keep_archives: int = 5,
    ) -> T:
        """Run ``fn`` under the row lock of a settled (completed/partial) row.

        Used by mutators to edit another step's checkpoint: refused while that step is
        running (its owner would publish over the edit) or has no completed result. With
        ``reseal`` the row's checkpoint seal becomes ``seal`` in the same transaction (a
        partial row never keeps one). ``pointer`` (object storage): the edited checkpoint's
        manifest, stored in the same transaction after ``fn`` (the compare-and-set) passed;
        the pointer it replaces is archived with ``reason``.
        """
        once = Once(fn)  # retried after a dropped connection: the edit runs at most once
        ts = _now()

        def body(attempt: int) -> T:
            with self._write() as conn:
                landed = attempt > 1 and pointer is not None
                if landed and pointers.current_pointer(conn, key) == pointer:
                    return once()  # the commit landed: ``fn`` ran, its result is kept
                row = conn.execute(
                    sa.select(step_run.c.status, step_run.c.run_id)
                    .where(self._key_clause(key))
                    .with_for_update()
                ).first()
                if row is None or row.status not in SETTLED_RESULT:
                    status = "absent" if row is None else row.status
                    running = status == StepStatus.RUNNING
                    code = "step.victim_running" if running else "step.victim_not_settled"
                    raise PipelineError(
                        code,
                        f"{key}: cannot edit its checkpoint while its ledger row is {status}",
                        status=409,
                    )
                if reseal:
                    completed = row.status == StepStatus.COMPLETED
                    conn.execute(
                        sa.update(step_run)
                        .where(self._key_clause(key))
                        .values(checkpoint_seal=seal if completed else None)
                    )
                result = once()
                if pointer is not None:
                    pointers.replace_pointer(
                        conn, key, pointer, reason=reason, run_id=run_id, keep=keep_archives, now=ts
                    )
                return result

        return self._retry("edit a settled row", body, callbacks=(once,))

    # The three owner-aware updates below write fixed values (timestamps taken once, before
    # the first attempt): run twice, they match the same row and leave it the same.
    def reset_recovery(self, key: StepKey, run_id: str) -> bool:
        statement = (
            sa.update(step_run)
            .where(self._owned(key, run_id))
            .values(
                recovery_count=0,
                last_recovery_reason=None,
                retry_not_before=None,
                updated_at=_now(),
            )
        )
        return self._in_single("reset recovery", lambda c: c.execute(statement).rowcount == 1)

    def set_retry_not_before(self, key: StepKey, run_id: str, when: str) -> bool:
        statement = (
            sa.update(step_run)
            .where(self._owned(key, run_id))
            .values(retry_not_before=when, updated_at=_now())
        )
        return self._in_single("set retry_not_before", lambda c: c.execute(statement).rowcount == 1)

    def heartbeat(self, key: StepKey, run_id: str, now: str | None = None) -> bool:
        """Renew the owner's lease; False when the row no longer names ``run_id``."""
        statement = (
            sa.update(step_run).where(self._owned(key, run_id)).values(heartbeat_at=now or _now())
        )
        return self._in_single("heartbeat", lambda c: c.execute(statement).rowcount == 1)

    def invalidate(
        self, keys: Iterable[StepKey], reason: str, now: str | None = None
    ) -> list[StepKey]:
        """Mark rows stale (explicit force only). Running rows are left to their owner."""
        ts = now or _now()
        wanted = list(keys)  # a retry walks them again

        # Run again after a lost commit, each update finds its row stale (not running) and
        # writes the same values: the same keys come back.
        def body(_attempt: int) -> list[StepKey]:
            done: list[StepKey] = []
            with self._write() as conn:
                for key in wanted:
                    result = conn.execute(
                        sa.update(step_run)
                        .where(self._key_clause(key), status_guard("invalidate"))
                        .values(
                            status=StepStatus.STALE.value,
                            updated_at=ts,
                            result_summary=reason,
                            checkpoint_seal=None,
                        )
                    )
                    if result.rowcount == 1:
                        done.append(key)
                        # On object storage the checkpoint leaves service with its row (the
                        # local store moves the file to archive/): its pointer is archived.
                        pointers.replace_pointer(
                            conn, key, None, reason="force", run_id=None, keep=5, now=ts
                        )
            return done

        return self._retry("invalidate", body)

    def reset_running(self, key: StepKey, expected_started_at: str | None, reason: str) -> bool:
        """Operator reset of a stuck row to failed; refuses unless it is unchanged."""
        started = (
            step_run.c.started_at.is_(None)
            if expected_started_at is None
            else step_run.c.started_at == expected_started_at
        )
        ts = _now()
        statement = (
            sa.update(step_run)
            .where(self._key_clause(key), status_guard("reset_running"), started)
            .values(
                status=StepStatus.FAILED.value,
                error_message=reason,
                updated_at=ts,
                completed_at=ts,
                checkpoint_seal=None,
            )
        )

        def body(attempt: int) -> bool:
            with self._single() as conn:
                if conn.execute(statement).rowcount == 1:
                    return True
                # After a lost answer the row is no longer running: ours if it is the reset
                # this call wrote (same reason, same timestamp).
                return attempt > 1 and self._row_is(
                    conn,
                    key,
                    status=StepStatus.FAILED,
                    error_message=reason,
                    updated_at=ts,
                    completed_at=ts,
                )

        return self._retry("reset running", body)

    # ----------------------------------------------------------------- audit and cost
    def append_transition(
        self,
        key: StepKey,
        *,
        action: str,
        from_status: str | None,
        to_status: str | None,
        origin: str | None = None,
        reason: str | None = None,
        run_id: str | None = None,
        launch_path: str | None = None,
        now: str | None = None,
    ) -> int:
        """A history line with no status change of its own (a SKIP, a block, an edit's
        note); a change of status takes its ``audit=`` in the same transaction instead."""
        audit = Audit(action, from_status, to_status, origin, reason, run_id, launch_path)
        return self.append_audit(key, audit, now=now)

    def append_audit(self, key: StepKey, audit: Audit, *, now: str | None = None) -> int:
        """``audit`` as a transaction of its own; its ``transition_seq``."""
        at = now or _now()

        def body(attempt: int) -> int:
            with self._single() as conn:
                return write_audit(conn, key, audit, at, attempt=attempt)

        return self._retry("append transition", body)

    def start_provider_call(self, key: StepKey, run_id: str | None, *, kind: str) -> int:
        """Record a call before it is sent (a kill during it leaves it unfinished)."""
        if kind not in ("text", "image"):
            raise PipelineError(
                "input.invalid", f"provider call kind must be text or image, not {kind!r}"
            )
        values = {
            "project_id": key.project_id,
            "episode_id": key.episode_id,
            "step_id": key.step_id,
            "run_id": run_id,
            "kind": kind,
            "units": 0,
            "at": _now(),
        }
        if self.is_sqlite:  # never retried (see _retry): the id comes back with the insert
            with self._single() as conn:
                inserted = conn.execute(
                    sa.insert(provider_call).values(values).returning(provider_call.c.id)
                ).scalar_one()
            return int(inserted)
        # PostgreSQL: the row's id is drawn from its sequence before the insert is sent, so
        # an insert retried after a lost answer names the same row (ON CONFLICT DO NOTHING)
        # and a paid call is never counted twice. One more round trip per provider call.
        allocated: list[int] = []

        def body(_attempt: int) -> int:
            with self._single() as conn:
                if not allocated:
                    allocated.append(int(conn.execute(_NEXT_CALL_ID).scalar_one()))
                conn.execute(
                    postgresql.insert(provider_call)
                    .values(id=allocated[0], **values)
                    .on_conflict_do_nothing(index_elements=[provider_call.c.id])
                )
            return allocated[0]

        return self._retry("record a provider call", body)

    def finish_provider_call(self, call_id: int, *, units: int, model: str | None) -> None:
        # Fixed values by primary key: run twice after a lost answer, the same row results.
        statement = (
            sa.update(provider_call)
            .where(provider_call.c.id == call_id)
            .values(units=units, model=model, finished_at=_now())
        )
        self._in_single("finish a provider call", lambda conn: conn.execute(statement))

    def record_provider_call(
        self, key: StepKey, run_id: str | None, *, kind: str, units: int, model: str | None
    ) -> None:
        """A finished call in one go (for callers that learn of a call afterwards)."""
        self.finish_provider_call(
            self.start_provider_call(key, run_id, kind=kind), units=units, model=model
        )
