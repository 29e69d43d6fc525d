"""The pipeline resource: settings, ledger and checkpoint store for one code location."""

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import dagster as dg

from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.settings import EffectiveSettings, ResumeSettings, resolve_settings
from pipeline_defs.resume.settings_registry import RESOURCE, SETTINGS
from resources.checkpoints.published import published_checkpoints
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore
from resources.storage import open_storage

_LOCK = threading.RLock()  # checkpoints_for builds a ledger store under it
_LEDGERS: dict[str, LedgerStore] = {}
_CHECKPOINTS: dict[tuple[Path, str | None, str | None, int], CheckpointStore] = {}

# The settings a field of the resource sets (a field each, above the variable and the ledger).
RESOURCE_KEYS: tuple[str, ...] = SETTINGS.keys_from(RESOURCE)


def ledger_for(url: str) -> LedgerStore:
    """One store per URL and process, so the schema check runs once."""
    with _LOCK:
        store = _LEDGERS.get(url)
        if store is None:
            store = _LEDGERS[url] = LedgerStore(url)
        return store


def checkpoints_for(
    home: Path, storage_url: str | None = None, ledger_url: str | None = None
) -> CheckpointStore:
    """One checkpoint store per data root (and storage) and process, sharing its caches.

    With ``storage_url`` checkpoints are published as objects and ``home`` holds inputs and
    this process's scratch (:func:`published_checkpoints`); the pointers come from the
    ledger at ``ledger_url``. Keyed by process too: a forked child gets its own scratch.
    """
    resolved = Path(home).resolve()
    key = (resolved, storage_url, ledger_url, os.getpid() if storage_url else 0)
    with _LOCK:
        store = _CHECKPOINTS.get(key)
        if store is None:
            if storage_url is None:
                store = CheckpointStore(resolved)
            else:
                if ledger_url is None:
                    raise ValueError("a published checkpoint store needs the ledger's URL")
                store = published_checkpoints(
                    resolved,
                    open_storage(storage_url, home=resolved),
                    LedgerPointers(ledger_for(ledger_url)),
                )
            _CHECKPOINTS[key] = store
        return store


class LedgerPointers:
    """The commit pointers of published checkpoints, read from their ledger rows."""

    def __init__(self, ledger: LedgerStore) -> None:
        self.ledger = ledger

    def episode_pointers(self, project_id: str, episode_id: str) -> Mapping[str, str | None]:
        rows = self.ledger.get_many(
            episodes=[Episode(project_id, episode_id)], columns=("checkpoint_pointer",)
        )
        return {key.step_id: row.checkpoint_pointer for key, row in rows.items()}

    def archived_pointers(self, key: StepKey) -> Sequence[str]:
        return self.ledger.archived_pointers(key)

    def pointer(self, key: StepKey) -> str | None:
        return self.row_pointer(key)[1]

    def row_pointer(self, key: StepKey) -> tuple[bool, str | None]:
        row = self.ledger.get(key)
        return (False, None) if row is None else (True, row.checkpoint_pointer)


class PipelineResource(dg.ConfigurableResource["PipelineResource"]):
    """Where the data lives and how the judge is tuned.

    One field per setting the registry lets the resource set (``RESOURCE_KEYS``: where the
    data and the ledger live, and every limit the ledger holds), each with its row's doc as
    the launchpad's help. Unset fields fall back to ``PIPELINE_*`` environment variables,
    read when a run or a sensor tick asks (never at import), then to the ledger's settings
    table (shared by the sensor daemon and every run worker), then to the defaults of
    :class:`ResumeSettings`.
    """

    home: str | None = SETTINGS["home"].resource_field()
    db_url: str | None = SETTINGS["db_url"].resource_field()
    # Where checkpoints are published: unset, files under ``home``; s3://, gs://, az://
    # (or a directory) makes ``home`` scratch.
    storage_url: str | None = SETTINGS["storage_url"].resource_field()
    running_timeout_seconds: int | None = SETTINGS["running_timeout_seconds"].resource_field()
    lease_seconds: float | None = SETTINGS["lease_seconds"].resource_field()
    heartbeat_seconds: float | None = SETTINGS["heartbeat_seconds"].resource_field()
    max_recovery_attempts: int | None = SETTINGS["max_recovery_attempts"].resource_field()
    retry_backoff_seconds: int | None = SETTINGS["retry_backoff_seconds"].resource_field()
    max_calls_per_episode: int | None = SETTINGS["max_calls_per_episode"].resource_field()

    def settings(self) -> ResumeSettings:
        return self.effective_settings().settings

    def effective_settings(self) -> EffectiveSettings:
        """The settings in force and where each came from (resource, env, ledger, default).

        The table is read through the store's short cache (``SETTINGS_MAX_AGE_SECONDS``):
        once per sensor tick or run, not once per step judgement.
        """
        return resolve_settings(
            ledger=self.ledger().stored_settings(),
            **{key: getattr(self, key) for key in RESOURCE_KEYS},
        )

    def location(self) -> ResumeSettings:
        """Where the data and the ledger live; the limits kept in the ledger are not read."""
        return ResumeSettings.locate(
            home=self.home, db_url=self.db_url, storage_url=self.storage_url
        )

    def ledger(self) -> LedgerStore:
        return ledger_for(self.location().ledger_url)

    def checkpoints(self) -> CheckpointStore:
        where = self.location()
        return checkpoints_for(where.home, where.storage_url, where.ledger_url)
