"""The ledger store: the only way to the ledger's database.

Every operation is a short transaction of its own: no connection or transaction is held
while a step body runs. The same statements run on PostgreSQL and SQLite.

:class:`LedgerStore` is the one public class: one :class:`~resources.ledger.session.LedgerSession`
(the engine, the schema on first use, the retry of a dropped connection) and a small part per
concern holding it, each in a module of its own; the store names their operations:

- :mod:`~resources.ledger.statements`: every SQL statement the parts run, by name;
- :mod:`~resources.ledger.engine`: one engine per URL and process, SQLite pragmas;
- :mod:`~resources.ledger.schema`: migrations to head;
- :mod:`~resources.ledger.settings_cache`: the ``settings`` table, cached and audited;
- :mod:`~resources.ledger.reads`: single and bulk reads, the cursor, audit and cost rows;
- :mod:`~resources.ledger.claims`: claims, adoptions, not-applicable rows;
- :mod:`~resources.ledger.status_writes`: the owner's transition, leases, force, reset;
- :mod:`~resources.ledger.publishing`: work under the row lock, commit pointers, seals;
- :mod:`~resources.ledger.audit_and_cost`: audit appends and provider-call rows;
- :mod:`~resources.ledger.run_leases`: each run's coordinator lease.
"""

from sqlalchemy.engine import Engine, make_url

from resources.ledger.audit import serve_as, worker
from resources.ledger.audit_and_cost import AuditAndCost
from resources.ledger.claims import NOT_JUDGED, Claims
from resources.ledger.engine import APPLICATION_NAME, CONNECT_TIMEOUT_SECONDS, engine_for
from resources.ledger.publishing import Publishing
from resources.ledger.reads import Reads
from resources.ledger.run_leases import RunLeases
from resources.ledger.schema import MIGRATIONS_DIR
from resources.ledger.session import LedgerSession
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
    "serve_as",
    "worker",
]


class LedgerStore:
    """Named ledger operations over SQLAlchemy Core, each one part's. ``step_run`` rows come
    back as :class:`LedgerRow`, audit rows as :class:`Transition`, cost rows as plain dicts."""

    def __init__(self, url: str) -> None:
        self.session = LedgerSession(url)
        settings = SettingsCache(self.session)
        reads = Reads(self.session)
        claims = Claims(self.session)
        status = StatusWrites(self.session)
        publishing = Publishing(self.session)
        audit = AuditAndCost(self.session)
        runs = RunLeases(self.session)
        # The schema
        self.migrate = self.session.migrate
        self.ensure_schema = self.session.ensure_schema
        # The settings table
        self.stored_settings = settings.stored_settings
        self.set_setting = settings.set_setting
        self.seed_settings = settings.seed_settings
        self.setting_changes = settings.setting_changes
        # Reads
        self.get = reads.get
        self.get_many = reads.get_many
        self.running_rows = reads.running_rows
        self.cursor = reads.cursor
        self.transitions = reads.transitions
        self.provider_calls = reads.provider_calls
        self.episode_calls = reads.episode_calls
        self.episode_estimate = reads.episode_estimate
        # Claims
        self.claim = claims.claim
        self.adopt = claims.adopt
        self.journal_lineage = claims.journal_lineage
        self.journal_lineages = claims.journal_lineages
        self.mark_not_applicable = claims.mark_not_applicable
        # The owner's status writes, leases, force and reset
        self.transition = status.transition
        self.reset_recovery = status.reset_recovery
        self.set_retry_not_before = status.set_retry_not_before
        self.heartbeat = status.heartbeat
        self.invalidate = status.invalidate
        self.reset_running = status.reset_running
        # Publishing: work under the row lock, commit pointers, seals
        self.publish = publishing.publish
        self.swap_pointer = publishing.swap_pointer
        self.adopt_pointer = publishing.adopt_pointer
        self.clear_seal = publishing.clear_seal
        self.seal_unchanged = publishing.seal_unchanged
        self.clear_episode_seals = publishing.clear_episode_seals
        self.archived_pointers = publishing.archived_pointers
        self.references = publishing.references
        self.with_settled_row = publishing.with_settled_row
        # The audit and the cost rows
        self.append_transition = audit.append_transition
        self.append_audit = audit.append_audit
        self.start_provider_call = audit.start_provider_call
        self.finish_provider_call = audit.finish_provider_call
        self.note_episode_estimate = audit.note_episode_estimate
        self.record_provider_call = audit.record_provider_call
        # Run leases: each run's coordinator proves it is alive
        self.begin_run = runs.begin_run
        self.renew_run = runs.renew_run
        self.end_run = runs.end_run
        self.run_leases = runs.run_leases

    @property
    def url(self) -> str:
        return self.session.url

    @property
    def engine(self) -> Engine:
        return self.session.engine

    @property
    def is_sqlite(self) -> bool:
        return self.session.is_sqlite

    def __repr__(self) -> str:
        return f"LedgerStore({make_url(self.url).render_as_string(hide_password=True)!r})"
