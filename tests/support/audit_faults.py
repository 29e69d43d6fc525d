"""A history line the database refuses: a real ``BEFORE INSERT`` trigger on the audit table
(``step_transition``) that raises, on PostgreSQL and SQLite alike.

Installed with :func:`refusing_audit` (a context manager) and dropped on the way out, so a
test can show that a unit of work whose audit line fails is rolled back whole: the status,
seal, pointer or checkpoint it carried stay as they were.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

TRIGGER = "test_audit_fault"
MESSAGE = "test fault: the audit line is refused"


def _statements(on_sqlite: bool, action: str) -> tuple[list[str], list[str]]:
    """(install, remove) statements of a trigger refusing lines whose action is ``action``."""
    literal = action.replace("'", "''")
    if on_sqlite:
        install = [
            f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON step_transition "
            f"WHEN NEW.action = '{literal}' "
            f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
        ]
        return install, [f"DROP TRIGGER IF EXISTS {TRIGGER}"]
    install = [
        f"CREATE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN RAISE EXCEPTION '{MESSAGE}'; END $$",
        f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON step_transition FOR EACH ROW "
        f"WHEN (NEW.action = '{literal}') EXECUTE FUNCTION {TRIGGER}()",
    ]
    remove = [
        f"DROP TRIGGER IF EXISTS {TRIGGER} ON step_transition",
        f"DROP FUNCTION IF EXISTS {TRIGGER}()",
    ]
    return install, remove


@contextmanager
def refusing_audit(url: str, action: str) -> Iterator[None]:
    """While inside, every insert of an audit line with ``action`` raises in the database.

    The ledger at ``url`` must be migrated (the table must exist). Its own engine is left
    alone: the trigger is installed over a connection of this helper's, then disposed.
    """
    engine = sa.create_engine(url)
    install, remove = _statements(engine.dialect.name == "sqlite", action)
    try:
        with engine.begin() as conn:
            for statement in install:
                conn.exec_driver_sql(statement)
        yield
    finally:
        with engine.begin() as conn:
            for statement in remove:
                conn.exec_driver_sql(statement)
        engine.dispose()
