"""The ledger store: the only place that speaks SQL to the ledger.

Every operation is a short transaction of its own: no connection or transaction is held
while a step body runs. The same statements run on PostgreSQL and SQLite.

:class:`LedgerStore` is the one public class; its operations live in modules of one concern
each, mixed in here on the plumbing they share (:mod:`resources.ledger.session`):

- :mod:`~resources.ledger.engine`: one engine per URL and process, SQLite pragmas;
- :mod:`~resources.ledger.schema`: migrations to head;
- :mod:`~resources.ledger.settings_cache`: the ``settings`` table, cached and audited;
- :mod:`~resources.ledger.reads`: single and bulk reads, the cursor, audit and cost rows;
- :mod:`~resources.ledger.claims`: claims, adoptions, not-applicable rows;
- :mod:`~resources.ledger.status_writes`: the owner's transition, leases, force, reset;
- :mod:`~resources.ledger.publishing`: work under the row lock, commit pointers, seals;
- :mod:`~resources.ledger.audit_and_cost`: audit appends and provider-call rows.
"""

from resources.ledger.audit_and_cost import AuditAndCost
from resources.ledger.claims import NOT_JUDGED, Claims, lock_owner
from resources.ledger.engine import APPLICATION_NAME, CONNECT_TIMEOUT_SECONDS, engine_for
from resources.ledger.publishing import Publishing
from resources.ledger.reads import Reads
from resources.ledger.schema import MIGRATIONS_DIR
from resources.ledger.settings_cache import SETTINGS_MAX_AGE_SECONDS, SettingsCache
from resources.ledger.status_writes import StatusWrites

__all__ = [
    "APPLICATION_NAME",
    "CONNECT_TIMEOUT_SECONDS",
    "MIGRATIONS_DIR",
    "NOT_JUDGED",
    "SETTINGS_MAX_AGE_SECONDS",
    "LedgerStore",
    "engine_for",
    "lock_owner",
]


class LedgerStore(SettingsCache, Reads, Claims, StatusWrites, Publishing, AuditAndCost):
    """Named ledger operations over SQLAlchemy Core. ``step_run`` rows come back as
    :class:`LedgerRow` (built here, once); audit and cost rows as plain dicts."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._migrated = False
        self._settings_cache = None
