"""A real ``LedgerStore`` on an in-memory SQLite database: no file, no server.

The store takes a URL and builds its engine itself (``resources/ledger/engine.py``:
``engine_for``, one engine per URL and process, pysqlite's default pool), so the in-memory
database must be one that URL reaches from every connection of that pool:

- ``sqlite://`` (``:memory:``) gets SQLAlchemy's ``SingletonThreadPool``: one connection,
  so one database, *per thread* (a lease's heartbeat thread, a racing claim, would each meet
  an empty database with no tables), and one engine for the whole process, so every test
  would share it;
- ``?mode=memory&cache=shared`` gets the same pool and a deprecation warning;
- a named database of SQLite's ``memdb`` VFS, ``file:/<name>?vfs=memdb``, is shared by
  every connection of this process that opens the same name. SQLAlchemy takes it for a file
  (``QueuePool``: real connections, one per thread), SQLite locks it as it locks a file
  (``BEGIN IMMEDIATE``, the busy timeout), so claims race as on a file. It lives while a
  connection to it is open: ``open_memory_ledger`` holds one, and a fresh name per ledger
  keeps tests apart.

What differs from a ledger file: ``stored_settings`` answers ``{}`` (it refuses to open a
SQLite ledger that has no file, so as not to create one), and the journal is in memory
(``PRAGMA journal_mode=WAL`` is a no-op there). Everything else is the product's SQL.
"""

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator

from resources.ledger.store import LedgerStore


def memory_ledger_url(name: str) -> tuple[str, str]:
    """The SQLAlchemy URL of the in-memory database ``name`` and its SQLite URI."""
    uri = f"file:/{name}?vfs=memdb"
    return f"sqlite:///{uri}&uri=true", uri


@contextlib.contextmanager
def open_memory_ledger() -> Iterator[LedgerStore]:
    """A migrated ledger on a fresh in-memory database, gone when the block ends."""
    url, uri = memory_ledger_url(f"ledger-{uuid.uuid4().hex}")
    keeper = sqlite3.connect(uri, uri=True)  # the database lives while this is open
    try:
        ledger = LedgerStore(url)
        ledger.migrate()
        try:
            yield ledger
        finally:
            ledger.engine.dispose()
    finally:
        keeper.close()
