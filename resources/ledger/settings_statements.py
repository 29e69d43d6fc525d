"""The statements of the ledger's ``settings`` table and its audit (``setting_change``).

Run by :mod:`resources.ledger.settings_cache` (the rules of every statement module are
:mod:`resources.ledger.statements`'). Nothing here executes; every function returns a
statement.
"""

from typing import Any

import sqlalchemy as sa

from resources.ledger.tables import setting_change, settings

# Serialize changes of the settings table on PostgreSQL (SQLite's BEGIN IMMEDIATE does).
LOCK_SETTINGS = "LOCK TABLE settings IN SHARE ROW EXCLUSIVE MODE"


def every_setting() -> sa.Select[Any]:
    return sa.select(settings.c.key, settings.c.value)


def insert_setting(key: str, **row: str) -> sa.Insert:
    return sa.insert(settings).values(key=key, **row)


def update_setting(key: str, **row: str) -> sa.Update:
    return sa.update(settings).where(settings.c.key == key).values(**row)


def record_setting_change(
    key: str, *, old: str | None, new: str, at: str, changed_by: str
) -> sa.Insert:
    return sa.insert(setting_change).values(
        key=key, old_value=old, new_value=new, changed_at=at, changed_by=changed_by
    )


def setting_changes() -> sa.Select[Any]:
    return sa.select(setting_change).order_by(setting_change.c.id)
