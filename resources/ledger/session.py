"""How every ledger operation reaches the database: the schema on first use, one short
transaction per operation, and the retry of a dropped PostgreSQL connection.

Every operation is a short transaction of its own: no connection or transaction is held
while a step body runs. The same statements (:mod:`resources.ledger.statements`) run on
PostgreSQL and SQLite. :class:`LedgerSession` is the one object the store's per-concern
parts share (each holds it).
"""

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy.engine import Connection, Engine

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.partition import StepKey
from resources.ledger import statements
from resources.ledger.engine import engine_for
from resources.ledger.retry import Once, retry_dropped
from resources.ledger.schema import migrate_to_head

T = TypeVar("T")


def now_text() -> str:
    """Now, as the ISO text the ledger stores."""
    return format_timestamp(datetime.now(UTC))


class LedgerSession:
    """The plumbing every part of :class:`~resources.ledger.store.LedgerStore` runs on: one
    per store, shared by its parts (composition: each part holds it)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._migrated = False

    # ----------------------------------------------------------------- plumbing
    @property
    def engine(self) -> Engine:
        return engine_for(self.url)

    @property
    def is_sqlite(self) -> bool:
        """From the URL, as ``engine_for`` decides: no engine lookup on the claim path."""
        return self.url.startswith("sqlite")

    def write(self) -> Any:
        """A short write transaction (BEGIN IMMEDIATE on SQLite)."""
        self.ensure_schema()
        return self.engine.begin()

    def single(self) -> Any:
        """One self-contained statement: autocommit on PostgreSQL (one round trip instead
        of BEGIN/statement/COMMIT), an immediate transaction on SQLite."""
        self.ensure_schema()
        if self.is_sqlite:
            return self.engine.begin()
        return self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    def read(self) -> Any:
        self.ensure_schema()
        if self.is_sqlite:
            return self.engine.connect().execution_options(read_only=True)
        return self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")

    # Every operation below runs as ``body(attempt)`` through :meth:`_retry`: one whole unit
    # of work (connection, transaction, statements, commit) that PostgreSQL may make run
    # again after a dropped connection (resources.ledger.retry). A write whose effect is
    # not the same when run twice looks for its own earlier success on ``attempt > 1``.
    def retry(
        self,
        what: str,
        body: Callable[[int], T],
        *,
        callbacks: Sequence[Once[Any]] = (),
    ) -> T:
        if self.is_sqlite:  # embedded: no server to lose; "database is locked" is no blip
            return body(1)
        return retry_dropped(body, url=self.url, what=what, callbacks=callbacks)

    def in_single(self, what: str, fn: Callable[[Connection], T]) -> T:
        """One statement whose second run changes nothing more (fixed values, owner-aware)."""

        def body(_attempt: int) -> T:
            with self.single() as conn:
                return fn(conn)

        return self.retry(what, body)

    def in_read(self, what: str, fn: Callable[[Connection], T]) -> T:
        def body(_attempt: int) -> T:
            with self.read() as conn:
                return fn(conn)

        return self.retry(what, body)

    def migrate(self) -> str:
        """Bring the database to the head revision; returns the revision."""
        return self.retry("migrate", lambda _attempt: self.migrate_now())

    def migrate_now(self) -> str:
        """:meth:`migrate` without the retry (run inside an operation that retries)."""
        head = migrate_to_head(self.engine)
        self._migrated = True
        return head

    def ensure_schema(self) -> None:
        """Migrate on first use; called inside every operation, so inside its retry."""
        if not self._migrated:
            self.migrate_now()

    def row_is(self, conn: Connection, key: StepKey, **expected: Any) -> bool:
        """Whether the key's row exists with exactly these column values (after an unknown
        outcome: did our own write land?)."""
        found = conn.execute(statements.row_columns(key, expected)).first()
        return found is not None and all(
            value == want for value, want in zip(found, expected.values(), strict=True)
        )
