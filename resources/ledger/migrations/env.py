"""Alembic environment: the store hands over a live connection in ``config.attributes``."""

from alembic import context

from resources.ledger.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - migrations always run through LedgerStore.migrate
    raise RuntimeError(
        "run ledger migrations through LedgerStore.migrate() or `storyboard migrate`"
    )

context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
