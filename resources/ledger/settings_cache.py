"""The ledger's ``settings`` table: a short per-process cache of it, and its audited changes.

A value is validated with the whole table before anything is written
(:func:`~pipeline_defs.resume.settings.validate_ledger_values`); every change leaves a
``setting_change`` row.
"""

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from pipeline_defs.resume.settings import validate_ledger_values
from resources.ledger import settings_statements
from resources.ledger.retry import is_dropped_connection
from resources.ledger.session import LedgerSession, now_text
from resources.ledger.tables import settings

# How stale a process's copy of the settings table may be: a run's steps and a sensor's tick
# read it at most once per this many seconds, and a change applies everywhere within it.
SETTINGS_MAX_AGE_SECONDS = 5.0


class SettingsCache:
    """Reads (cached) and audited writes of the ``settings`` table."""

    def __init__(self, session: LedgerSession) -> None:
        self.session = session
        self._settings_cache: tuple[float, dict[str, str]] | None = None

    def stored_settings(self, max_age: float = SETTINGS_MAX_AGE_SECONDS) -> dict[str, str]:
        """The ledger's settings table (key -> value), read at most every ``max_age`` s.

        Read without migrating: read-only commands must not write schema, and a ledger that
        does not exist yet (or predates the table) holds no settings. A database that
        cannot be reached still fails.
        """
        cached = self._settings_cache
        if cached is not None and time.monotonic() - cached[0] < max_age:
            return dict(cached[1])
        values = self.session.retry("read settings", lambda _attempt: self._read_settings())
        self._settings_cache = (time.monotonic(), values)
        return dict(values)

    def _read_settings(self) -> dict[str, str]:
        if self.session.is_sqlite:
            database = sa.engine.make_url(self.session.url).database or ""
            if database in ("", ":memory:") or not Path(database).is_file():
                return {}  # connecting would create the file
        try:
            return self._select_settings()
        except sa.exc.DBAPIError as exc:
            if is_dropped_connection(exc):
                raise  # the server, not the table, is missing: retried whole
            with self.session.engine.connect() as conn:
                if not sa.inspect(conn).has_table(settings.name):
                    return {}  # not migrated to 0004 yet
        # The table is there now: another process migrated the new ledger between the read
        # and the look (processes started at once on a fresh ledger). Read it again.
        return self._select_settings()

    def _select_settings(self) -> dict[str, str]:
        query = settings_statements.every_setting()
        if self.session.is_sqlite:
            conn = self.session.engine.connect().execution_options(read_only=True)
        else:
            conn = self.session.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        with conn:
            return {str(k): str(v) for k, v in conn.execute(query).all()}

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
            with self.session.write() as conn:
                return self._apply_settings(conn, values, changed_by=changed_by, keep=keep)

        changes = self.session.retry("change settings", body)
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
        if not self.session.is_sqlite:
            # Serialize changes: two keys validated apart (lease, heartbeat) could make
            # a pair neither change alone would allow. SQLite's BEGIN IMMEDIATE does this.
            conn.exec_driver_sql(settings_statements.LOCK_SETTINGS)
        rows = conn.execute(settings_statements.every_setting()).all()
        current = {str(k): str(v) for k, v in rows}
        wanted = {k: v for k, v in values.items() if not (keep and k in current)}
        merged = validate_ledger_values({**current, **wanted})  # raises: nothing written
        now = now_text()
        for key in wanted:
            old, new = current.get(key), merged[key]
            if old == new:
                continue
            row = {"value": new, "updated_at": now, "updated_by": changed_by[key]}
            if old is None:
                conn.execute(settings_statements.insert_setting(key, **row))
            else:
                conn.execute(settings_statements.update_setting(key, **row))
            conn.execute(
                settings_statements.record_setting_change(
                    key, old=old, new=new, at=now, changed_by=changed_by[key]
                )
            )
            changes[key] = (old, new)
        return changes

    def setting_changes(self) -> list[dict[str, Any]]:
        """The audit trail of the settings table, oldest first."""
        query = settings_statements.setting_changes()
        return self.session.in_read(
            "read setting changes",
            lambda conn: [dict(r) for r in conn.execute(query).mappings()],
        )
