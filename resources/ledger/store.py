"""The ledger store: the only way to the ledger's database.

Every operation is a short transaction of its own: no connection or transaction is held
while a step body runs. The same statements run on PostgreSQL and SQLite.

:class:`LedgerStore` is the one public class: one :class:`~resources.ledger.session.LedgerSession`
(the engine, the schema on first use, the retry of a dropped connection) and a part per
concern holding it, each a module: ``settings_cache``, ``reads``, ``claims``,
``status_writes``, ``publishing``, ``audit_and_cost``, ``run_leases`` (their operations are
the store's methods, each with the part's signature, delegating), ``spend`` and
``rate_limits`` (the store's attributes of those names). Every SQL statement is named in
``statements`` and the ``*_statements`` modules beside it.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy.engine import Engine, make_url

from pipeline_defs.resume.money import Reservation, Usage
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from resources.ledger.audit import Audit, Transition, serve_as, worker
from resources.ledger.audit_and_cost import AuditAndCost
from resources.ledger.claims import NOT_JUDGED, Claims, Seen
from resources.ledger.engine import APPLICATION_NAME, CONNECT_TIMEOUT_SECONDS, engine_for
from resources.ledger.pointers import References
from resources.ledger.publishing import Publishing
from resources.ledger.rate_limits import RateLimits
from resources.ledger.reads import Reads
from resources.ledger.run_leases import RunLeaseRow, RunLeases
from resources.ledger.schema import MIGRATIONS_DIR
from resources.ledger.session import LedgerSession
from resources.ledger.settings_cache import SETTINGS_MAX_AGE_SECONDS, SettingsCache
from resources.ledger.spend import Spend
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

T = TypeVar("T")


class LedgerStore:
    """Named ledger operations over SQLAlchemy Core, each one part's. ``step_run`` rows come
    back as :class:`LedgerRow`, audit rows as :class:`Transition`, cost rows as plain dicts."""

    def __init__(self, url: str) -> None:
        self.session = LedgerSession(url)
        self._settings = SettingsCache(self.session)
        self._reads = Reads(self.session)
        self._claims = Claims(self.session)
        self._status = StatusWrites(self.session)
        self._publishing = Publishing(self.session)
        self._audit = AuditAndCost(self.session)
        self._runs = RunLeases(self.session)
        # Calls settled in money and the spend read back (docs/DESIGN.md#money-budgets).
        self.spend = Spend(self.session)
        # The shared rate limit per endpoint and model (docs/DESIGN.md#rate-limit).
        self.rate_limits = RateLimits(self.session)

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

    # ------------------------------------------------------------------ the schema
    def migrate(self) -> str:
        """Bring the database to the head revision; returns the revision."""
        return self.session.migrate()

    def ensure_schema(self) -> None:
        """Migrate on first use (every operation calls it)."""
        self.session.ensure_schema()

    # ------------------------------------------------------------ the settings table
    def stored_settings(self, max_age: float = SETTINGS_MAX_AGE_SECONDS) -> dict[str, str]:
        """The ledger's settings table (key -> value), read at most every ``max_age`` s."""
        return self._settings.stored_settings(max_age)

    def set_setting(self, key: str, value: str, *, changed_by: str) -> tuple[str | None, str]:
        """Set one setting (validated with the whole table) and audit it: ``(old, new)``."""
        return self._settings.set_setting(key, value, changed_by=changed_by)

    def seed_settings(
        self, values: Mapping[str, str], *, changed_by: Mapping[str, str]
    ) -> dict[str, tuple[str | None, str]]:
        """Insert the keys the table does not hold yet, keeping every value already there."""
        return self._settings.seed_settings(values, changed_by=changed_by)

    def setting_changes(self) -> list[dict[str, Any]]:
        """The audit trail of the settings table, oldest first."""
        return self._settings.setting_changes()

    # ------------------------------------------------------------------------ reads
    def get(self, key: StepKey) -> LedgerRow | None:
        """The step's row (None: no row)."""
        return self._reads.get(key)

    def get_many(
        self,
        *,
        episodes: Iterable[Episode] | None = None,
        step_ids: Iterable[str] | None = None,
        changed_since: tuple[int, str] | None = None,
        columns: Sequence[str] | None = None,
    ) -> dict[StepKey, LedgerRow]:
        """All rows (optionally of some episodes/steps, or changed since a cursor) in one query."""
        return self._reads.get_many(
            episodes=episodes, step_ids=step_ids, changed_since=changed_since, columns=columns
        )

    def running_rows(self) -> list[LedgerRow]:
        """Every row that is running."""
        return self._reads.running_rows()

    def cursor(self) -> tuple[int, str]:
        """(highest transition_seq, latest updated_at): changes when any row or audit changes."""
        return self._reads.cursor()

    def transitions(
        self,
        key: StepKey | None = None,
        *,
        since_seq: int = 0,
        episodes: Iterable[Episode] | None = None,
    ) -> list[Transition]:
        """History lines (of one step, of ``episodes``, or all), in commit order."""
        return self._reads.transitions(key, since_seq=since_seq, episodes=episodes)

    def provider_calls(
        self,
        key: StepKey | None = None,
        *,
        run_id: str | None = None,
        episode: Episode | None = None,
        episodes: Iterable[Episode] | None = None,
    ) -> list[dict[str, Any]]:
        """Provider-call rows (of one step, an episode or ``episodes``, a run, or all)."""
        return self._reads.provider_calls(key, run_id=run_id, episode=episode, episodes=episodes)

    def episode_calls(self, project_id: str, episode_id: str) -> int:
        """How many provider calls the episode has recorded: what its spend cap counts."""
        return self._reads.episode_calls(project_id, episode_id)

    def episode_estimate(self, project_id: str, episode_id: str) -> int | None:
        """The calls the episode's story was estimated at when registered (None: unknown)."""
        return self._reads.episode_estimate(project_id, episode_id)

    # ----------------------------------------------------------------------- claims
    def claim(
        self,
        key: StepKey,
        run_id: str,
        *,
        allow_stale_steal: bool = False,
        expected_started_at: str | None = None,
        expected_run_id: str | None = None,
        expected_heartbeat_at: str | None = None,
        auto_recovery: bool = False,
        fresh: bool = False,
        reason: str | None = None,
        now: str | None = None,
        seen: Seen = NOT_JUDGED,
        audit: Audit | None = None,
        refused: Audit | None = None,
    ) -> bool:
        """One atomic upsert: take the row unless another owner is running it."""
        return self._claims.claim(
            key,
            run_id,
            allow_stale_steal=allow_stale_steal,
            expected_started_at=expected_started_at,
            expected_run_id=expected_run_id,
            expected_heartbeat_at=expected_heartbeat_at,
            auto_recovery=auto_recovery,
            fresh=fresh,
            reason=reason,
            now=now,
            seen=seen,
            audit=audit,
            refused=refused,
        )

    def adopt(
        self,
        key: StepKey,
        run_id: str,
        *,
        summary: str,
        seal: str | None = None,
        pointer: str | None = None,
        now: str | None = None,
        audit: Audit | None = None,
    ) -> bool:
        """Record a verified orphan checkpoint as completed; never overwrites an existing row."""
        return self._claims.adopt(
            key, run_id, summary=summary, seal=seal, pointer=pointer, now=now, audit=audit
        )

    def journal_lineage(self, key: StepKey, run_id: str) -> str | None:
        """The journal lineage of the row while claim ``run_id`` holds it (None: it does not)."""
        return self._claims.journal_lineage(key, run_id)

    def journal_lineages(self) -> dict[StepKey, tuple[str, str | None]]:
        """Every row's (status, journal lineage), by key."""
        return self._claims.journal_lineages()

    def mark_not_applicable(
        self,
        key: StepKey,
        run_id: str,
        reason: str,
        now: str | None = None,
        *,
        audit: Audit | None = None,
    ) -> bool:
        """Record that the step does not apply here; never touches a running row."""
        return self._claims.mark_not_applicable(key, run_id, reason, now, audit=audit)

    # --------------------------------- the owner's status writes, leases, force, reset
    def transition(
        self,
        key: StepKey,
        run_id: str,
        status: StepStatus | str,
        *,
        require_owner: bool = True,
        applicable_count: int | None = None,
        completed_count: int | None = None,
        failed_count: int | None = None,
        error: str | None = None,
        summary: str | None = None,
        resolved_model: str | None = None,
        input_hash: str | None = None,
        publish: Callable[[], Any] | None = None,
        seal: str | None = None,
        pointer: str | None = None,
        keep_archives: int = 5,
        now: str | None = None,
        audit: Audit | None = None,
        refused: Audit | None = None,
    ) -> bool:
        """Move the row to ``status`` if this run still owns it (publishing under its lock)."""
        return self._status.transition(
            key,
            run_id,
            status,
            require_owner=require_owner,
            applicable_count=applicable_count,
            completed_count=completed_count,
            failed_count=failed_count,
            error=error,
            summary=summary,
            resolved_model=resolved_model,
            input_hash=input_hash,
            publish=publish,
            seal=seal,
            pointer=pointer,
            keep_archives=keep_archives,
            now=now,
            audit=audit,
            refused=refused,
        )

    def reset_recovery(self, key: StepKey, run_id: str) -> bool:
        """Clear the owner's recovery count, reason and retry time."""
        return self._status.reset_recovery(key, run_id)

    def set_retry_not_before(self, key: StepKey, run_id: str, when: str) -> bool:
        """Set the owner's ``retry_not_before``."""
        return self._status.set_retry_not_before(key, run_id, when)

    def heartbeat(self, key: StepKey, run_id: str, now: str | None = None) -> bool:
        """Renew the owner's lease; False when the row no longer names ``run_id``."""
        return self._status.heartbeat(key, run_id, now)

    def invalidate(
        self,
        keys: Iterable[StepKey],
        reason: str,
        now: str | None = None,
        *,
        audit: Audit | None = None,
    ) -> list[StepKey]:
        """Mark rows stale (explicit force only). Running rows are left to their owner."""
        return self._status.invalidate(keys, reason, now, audit=audit)

    def reset_running(self, key: StepKey, expected_started_at: str | None, reason: str) -> bool:
        """Operator reset of a stuck row to failed; refuses unless it is unchanged."""
        return self._status.reset_running(key, expected_started_at, reason)

    # ------------------------------ publishing: the row lock, commit pointers, seals
    def publish(
        self,
        key: StepKey,
        run_id: str,
        fn: Callable[[], T],
        *,
        pointer: str | None = None,
        keep_archives: int = 5,
    ) -> T:
        """Run ``fn`` while holding the row lock of a row that still names this owner."""
        return self._publishing.publish(
            key, run_id, fn, pointer=pointer, keep_archives=keep_archives
        )

    def swap_pointer(
        self,
        key: StepKey,
        *,
        expected: str,
        pointer: str,
        run_id: str | None,
        reason: str = "mutation",
        keep_archives: int = 5,
        now: str | None = None,
    ) -> bool:
        """Compare-and-set of a settled row's commit pointer; the replaced one is archived."""
        return self._publishing.swap_pointer(
            key,
            expected=expected,
            pointer=pointer,
            run_id=run_id,
            reason=reason,
            keep_archives=keep_archives,
            now=now,
        )

    def adopt_pointer(self, key: StepKey, pointer: str, now: str | None = None) -> bool:
        """First pointer of a settled row that has none (``storyboard storage migrate``)."""
        return self._publishing.adopt_pointer(key, pointer, now)

    def clear_seal(self, key: StepKey, seal: str, now: str | None = None) -> bool:
        """Drop ``seal`` from the row while it still carries it."""
        return self._publishing.clear_seal(key, seal, now)

    def seal_unchanged(
        self, key: StepKey, seal: str, *, seen: LedgerRow, audit: Audit | None = None
    ) -> bool:
        """Seal a completed, unsealed row, compare-and-set on ``seen`` (the row as read)."""
        return self._publishing.seal_unchanged(key, seal, seen=seen, audit=audit)

    def clear_episode_seals(self, project_id: str, episode_id: str) -> int:
        """Drop every seal of one episode's rows (its inputs were replaced)."""
        return self._publishing.clear_episode_seals(project_id, episode_id)

    def archived_pointers(self, key: StepKey) -> list[str]:
        """The step's replaced commit pointers, newest first."""
        return self._publishing.archived_pointers(key)

    def references(self) -> References:
        """Every commit pointer (current and archived) and every claim: what gc must keep."""
        return self._publishing.references()

    def with_settled_row(
        self,
        key: StepKey,
        fn: Callable[[], T],
        *,
        check: Callable[[], None] | None = None,
        reseal: bool = False,
        seal: str | None = None,
        pointer: str | None = None,
        reason: str = "mutation",
        run_id: str | None = None,
        keep_archives: int = 5,
        audit: Audit | None = None,
        refused: Audit | None = None,
    ) -> T:
        """Run ``fn`` under the row lock of a settled row: the edit, seal, pointer and line."""
        return self._publishing.with_settled_row(
            key,
            fn,
            check=check,
            reseal=reseal,
            seal=seal,
            pointer=pointer,
            reason=reason,
            run_id=run_id,
            keep_archives=keep_archives,
            audit=audit,
            refused=refused,
        )

    # ------------------------------------------------------- the audit and the cost rows
    def append_transition(
        self,
        key: StepKey,
        *,
        action: str,
        from_status: str | None,
        to_status: str | None,
        origin: str | None = None,
        reason: str | None = None,
        run_id: str | None = None,
        launch_path: str | None = None,
        now: str | None = None,
    ) -> int:
        """A history line with no status change of its own; its ``transition_seq``."""
        return self._audit.append_transition(
            key,
            action=action,
            from_status=from_status,
            to_status=to_status,
            origin=origin,
            reason=reason,
            run_id=run_id,
            launch_path=launch_path,
            now=now,
        )

    def append_audit(self, key: StepKey, audit: Audit, *, now: str | None = None) -> int:
        """``audit`` as a transaction of its own; its ``transition_seq``."""
        return self._audit.append_audit(key, audit, now=now)

    def start_provider_call(
        self,
        key: StepKey,
        run_id: str | None,
        *,
        kind: str,
        cap: int | None = None,
        claimed: bool = False,
        reservation: Reservation | None = None,
    ) -> int:
        """Record (and count against ``cap``, reserve ``reservation`` under its money
        budgets) a call before it is sent; its row id."""
        return self._audit.start_provider_call(
            key, run_id, kind=kind, cap=cap, claimed=claimed, reservation=reservation
        )

    def finish_provider_call(
        self,
        call_id: int,
        *,
        units: int,
        model: str | None,
        usage: Usage | None = None,
        cost_micros: int | None = None,
        reserved_micros: int = 0,
    ) -> None:
        """Record what a started call used and cost and which model answered (its cost in
        place of its reservation; None: the reservation stands)."""
        self._audit.finish_provider_call(
            call_id,
            units=units,
            model=model,
            usage=usage,
            cost_micros=cost_micros,
            reserved_micros=reserved_micros,
        )

    def note_episode_estimate(self, project_id: str, episode_id: str, estimated: int) -> None:
        """Record the calls an episode's story is estimated at (``add-episode``)."""
        self._audit.note_episode_estimate(project_id, episode_id, estimated)

    def record_provider_call(
        self, key: StepKey, run_id: str | None, *, kind: str, units: int, model: str | None
    ) -> None:
        """A finished call in one go (for callers that learn of a call afterwards)."""
        self._audit.record_provider_call(key, run_id, kind=kind, units=units, model=model)

    # ------------------------------------------ run leases: each run's coordinator lives
    def begin_run(self, run_id: str, now: str | None = None) -> None:
        """Take ``run_id``'s lease for this process (again, if a coordinator resumes it)."""
        self._runs.begin_run(run_id, now)

    def renew_run(self, run_id: str, now: str | None = None) -> bool:
        """Renew ``run_id``'s lease; False when it is ended (or was never taken)."""
        return self._runs.renew_run(run_id, now)

    def end_run(self, run_id: str, now: str | None = None) -> bool:
        """End ``run_id``'s lease (its coordinator finished, or its run was ended)."""
        return self._runs.end_run(run_id, now)

    def run_leases(
        self, run_ids: Sequence[str] | None = None, *, open_only: bool = False
    ) -> dict[str, RunLeaseRow]:
        """Run leases by run id (of ``run_ids``, or all; only open ones with ``open_only``)."""
        return self._runs.run_leases(run_ids, open_only=open_only)
