"""The pipeline resource: settings, ledger and checkpoint store for one code location."""

import threading
from pathlib import Path

import dagster as dg

from pipeline_defs.resume.settings import EffectiveSettings, ResumeSettings, resolve_settings
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore

_LOCK = threading.Lock()
_LEDGERS: dict[str, LedgerStore] = {}
_CHECKPOINTS: dict[Path, CheckpointStore] = {}


def ledger_for(url: str) -> LedgerStore:
    """One store per URL and process, so the schema check runs once."""
    with _LOCK:
        store = _LEDGERS.get(url)
        if store is None:
            store = _LEDGERS[url] = LedgerStore(url)
        return store


def checkpoints_for(home: Path) -> CheckpointStore:
    """One checkpoint store per data root and process, sharing its envelope cache."""
    resolved = Path(home).resolve()
    with _LOCK:
        store = _CHECKPOINTS.get(resolved)
        if store is None:
            store = _CHECKPOINTS[resolved] = CheckpointStore(resolved)
        return store


class PipelineResource(dg.ConfigurableResource):
    """Where the data lives and how the judge is tuned.

    Unset fields fall back to ``PIPELINE_*`` environment variables, read when a run or a
    sensor tick asks (never at import), then to the ledger's settings table (shared by the
    sensor daemon and every run worker), then to the defaults of :class:`ResumeSettings`.
    """

    home: str | None = None
    db_url: str | None = None
    running_timeout_seconds: int | None = None
    max_recovery_attempts: int | None = None
    retry_backoff_seconds: int | None = None

    def settings(self) -> ResumeSettings:
        return self.effective_settings().settings

    def effective_settings(self) -> EffectiveSettings:
        """The settings in force and where each came from (resource, env, ledger, default).

        The table is read through the store's short cache (``SETTINGS_MAX_AGE_SECONDS``):
        once per sensor tick or run, not once per step judgement.
        """
        return resolve_settings(
            ledger=self.ledger().stored_settings(),
            home=self.home,
            db_url=self.db_url,
            running_timeout_seconds=self.running_timeout_seconds,
            max_recovery_attempts=self.max_recovery_attempts,
            retry_backoff_seconds=self.retry_backoff_seconds,
        )

    def location(self) -> ResumeSettings:
        """Where the data and the ledger live; the limits kept in the ledger are not read."""
        return ResumeSettings.locate(home=self.home, db_url=self.db_url)

    def ledger(self) -> LedgerStore:
        return ledger_for(self.location().ledger_url)

    def checkpoints(self) -> CheckpointStore:
        return checkpoints_for(self.location().home)
