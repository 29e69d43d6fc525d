"""The ledger's schema: Alembic migrations (``resources/ledger/migrations``) up to head."""

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from resources.ledger.retry import is_dropped_connection

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def migrate_to_head(engine: Engine) -> str:
    """Bring the database to the head revision (no retry of its own); returns the revision."""
    from alembic import command
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    if current != head:
        try:
            with engine.begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except sa.exc.DBAPIError as exc:
            if is_dropped_connection(exc):
                raise  # not a concurrent migration: the caller's retry runs it again
            # A concurrent process may have migrated first; accept it if it reached head.
            with engine.connect() as conn:
                if MigrationContext.configure(conn).get_current_revision() != head:
                    raise
    return str(head)
