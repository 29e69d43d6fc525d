"""Fakes for testing a code location built on these resources, with no server and no file.

What the pipeline's own fast tests use, public for other code locations' tests (as a
task library ships its in-memory connector):

- :class:`MemoryStorage`: the storage contract in a dict. It is one more backend of the
  storage contract suite (``tests/storage/test_storage_contract.py``, beside a directory,
  S3 and Azure), so it keeps every promise they keep;
- :func:`open_memory_ledger`: a real, migrated ``LedgerStore`` on an in-memory SQLite
  database (the product's SQL, no file), gone when the block ends;
- :class:`OfflineTextModel` and :class:`OfflineImageModel`: the deterministic models, no
  endpoint, no key (``provider.kind: offline``; defined in ``resources/providers/``).

``MemoryStorage``
-----------------

A fake, not a stand-in for a backend's quirks: it keeps every promise of the ``Storage``
protocol (``resources/storage/base.py``) and the contract suite proves it
(``tests/storage/test_storage_contract.py`` runs on it beside a directory, S3 and Azure):

- keys are checked by ``validate_key`` before anything is touched (``storage.invalid_key``);
- ``put_create`` refuses a key that holds an object (``storage.object_exists``), the first
  bytes stay;
- ``put_if_match`` is a compare-and-set on the e_tag (and the version, when the storage is
  versioned) of the object as the caller read it, else ``storage.precondition_failed`` and
  nothing changes; a missing object never matches;
- ``get`` of an absent key is ``storage.object_missing``, ``head`` of one is None, ``delete``
  of one is no error;
- every write gets a new e_tag (in the quoted form of a bucket's), even for the same bytes
  and for a key deleted and made again, so a stale reader can never match;
- ``list`` is recursive, per path segment, sorted by key (a bucket's order);
- every error names the key and the storage, with a cause, as the real backends' do.

One lock serialises every call, so its compare-and-sets are exact under threads (as a
bucket's are). Like a bucket, a key may be both an object and a prefix of others.

``open_memory_ledger``
----------------------
A real ``LedgerStore`` on an in-memory SQLite database: no file, no server.

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
import hashlib
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from pipeline_defs.resume.errors import PipelineError
from resources.ledger.store import LedgerStore
from resources.providers.offline_images import OfflineImageModel
from resources.providers.offline_text import OfflineTextModel
from resources.storage.base import (
    ObjectMeta,
    not_the_version,
    object_exists,
    object_missing,
    validate_key,
)

__all__ = [
    "MemoryStorage",
    "OfflineImageModel",
    "OfflineTextModel",
    "memory_ledger_url",
    "open_memory_ledger",
]


@dataclass(frozen=True)
class _Stored:
    data: bytes
    meta: ObjectMeta


class MemoryStorage:
    """Objects in a dict behind a lock (see the module docstring for the guarantees).

    ``name`` tells storages apart in messages (``memory://<name>``); ``versioned`` makes
    each write carry a version, as a versioned bucket's, which ``put_if_match`` checks too.
    """

    def __init__(self, name: str = "memory", *, versioned: bool = False) -> None:
        self._url = f"memory://{name}"
        self.versioned = versioned
        self._objects: dict[str, _Stored] = {}
        self._lock = threading.Lock()
        self._writes = 0  # every write's number: what makes e_tags and versions unique

    @property
    def url(self) -> str:
        return self._url

    @property
    def is_local(self) -> bool:
        return False  # no file to open in place: callers go through get/put, as on a bucket

    def __repr__(self) -> str:
        return f"MemoryStorage({self.url!r})"

    # -- the contract ------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        validate_key(key, storage=self.url)
        with self._lock:
            stored = self._objects.get(key)
        if stored is None:
            raise self._missing(key)
        return stored.data

    def head(self, key: str) -> ObjectMeta | None:
        validate_key(key, storage=self.url)
        with self._lock:
            stored = self._objects.get(key)
        return None if stored is None else stored.meta

    def put_create(self, key: str, data: bytes) -> ObjectMeta:
        validate_key(key, storage=self.url)
        data = bytes(data)
        with self._lock:
            if key in self._objects:
                raise self._exists(key)
            return self._write(key, data)

    def put_if_match(self, key: str, data: bytes, expected: ObjectMeta) -> ObjectMeta:
        validate_key(key, storage=self.url)
        data = bytes(data)
        with self._lock:
            stored = self._objects.get(key)
            current = None if stored is None else stored.meta
            if expected.key != key:
                raise self._precondition(
                    key, expected, current, f"the expected version is of key {expected.key!r}"
                )
            if expected.e_tag is None and expected.version is None:
                raise self._precondition(
                    key, expected, current, "the expected version names no e_tag"
                )
            if current is None:
                raise self._precondition(key, expected, None, "there is no object")
            if (expected.e_tag is not None and expected.e_tag != current.e_tag) or (
                expected.version is not None and expected.version != current.version
            ):
                cause = (
                    f"expected e_tag {expected.e_tag} version {expected.version}, found "
                    f"e_tag {current.e_tag} version {current.version}"
                )
                raise self._precondition(key, expected, current, cause)
            return self._write(key, data)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        # Validated now, not at the first next(): a bad prefix fails where it is passed.
        if prefix != "":
            validate_key(prefix, storage=self.url, what="prefix")
        below = f"{prefix}/" if prefix else ""
        with self._lock:
            found = [s.meta for k, s in self._objects.items() if k.startswith(below)]
        return iter(sorted(found, key=lambda meta: meta.key))

    def delete(self, key: str) -> None:
        """Remove the object; a missing one is not an error (garbage collection)."""
        validate_key(key, storage=self.url)
        with self._lock:
            self._objects.pop(key, None)

    # -- for tests: what is stored, without a request ------------------------------------

    def keys(self) -> tuple[str, ...]:
        """Every key stored, sorted."""
        with self._lock:
            return tuple(sorted(self._objects))

    # -- inside the lock -----------------------------------------------------------------

    def _write(self, key: str, data: bytes) -> ObjectMeta:
        self._writes += 1
        digest = hashlib.sha256(data).hexdigest()[:16]
        meta = ObjectMeta(
            key=key,
            size=len(data),
            e_tag=f'"{digest}-{self._writes:x}"',
            version=str(self._writes) if self.versioned else None,
            last_modified=datetime.now(UTC),
        )
        self._objects[key] = _Stored(data, meta)
        return meta

    # -- errors ------------------------------------------------------------------------

    def _missing(self, key: str) -> PipelineError:
        return object_missing(self.url, key, "no object under this key")

    def _exists(self, key: str) -> PipelineError:
        cause = "an object is already there and objects are create-only"
        return object_exists(self.url, key, cause)

    def _precondition(
        self, key: str, expected: ObjectMeta, current: ObjectMeta | None, cause: str
    ) -> PipelineError:
        versions = {
            "expected_e_tag": expected.e_tag,
            "expected_version": expected.version,
            "current_e_tag": None if current is None else current.e_tag,
        }
        return not_the_version(self.url, key, cause, versions)


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
