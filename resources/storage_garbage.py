"""Garbage collection of the shared store: what may be deleted, and the one core.

On a bucket nothing is overwritten: every publish leaves the previous attempt behind, and a
fenced worker's dead attempt stays too. Collection deletes a whole attempt prefix only when
no ledger row names any object in it (current pointers and the archived ones a step keeps),
no running row's step holds it, and its newest object is older than the grace period (at
least an hour: ``MIN_GRACE``), so an attempt still uploading before its publish is never
touched. The rows are read after the bucket is listed, right before deleting, so a step
published while the listing ran is named by then. Pending review edits live
outside the checkpoint tree and are never collected (docs/DESIGN.md#storage). The journal of
paid replies is collected by the same rules (docs/DESIGN.md#reply-journal), on a local home
too.

Two ways in, one core (:func:`collect_unnamed`): ``storyboard gc``
(``pipeline_defs/operations/garbage.py``) and the ``storage_gc`` job (``sensors/storage_gc.py``).
"""

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.checkpoints.bucket import Collection
from resources.checkpoints.journal import JournalCollection, collect_journal, lineages_in_use
from resources.checkpoints.manifest import Manifest
from resources.checkpoints.published import scratch_cache_of
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore

# Far longer than any upload-to-publish window of a step (its objects go up just before
# its publish), and than any clock skew between a worker and the storage.
DEFAULT_GRACE = timedelta(hours=24)
# The shortest grace gc accepts: an attempt uploaded now is committed within minutes.
MIN_GRACE = timedelta(hours=1)


@dataclass(frozen=True)
class GarbageReport:
    storage: str
    dry_run: bool
    grace_seconds: float
    collection: Collection
    journal: JournalCollection

    def as_dict(self) -> dict[str, Any]:
        return {
            "storage": self.storage,
            "dry_run": self.dry_run,
            "grace_seconds": self.grace_seconds,
            **asdict(self.collection),
            "journal": asdict(self.journal),
        }


# A local home's attempts: none (it keeps its own archives).
NOTHING = Collection((), 0, 0, 0, 0)


def collect_unnamed(
    store: CheckpointStore,
    ledger: LedgerStore,
    *,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    now: datetime | None = None,
) -> GarbageReport:
    """Delete unnamed, old attempt prefixes of the configured object storage, and the
    journal's entries of lineages no row holds (on a local home: the journal alone, the
    home keeps its own archives)."""
    if grace < MIN_GRACE:
        raise PipelineError(
            ErrorCode.INPUT_INVALID,
            f"the grace period {grace} is too short: it must be at least "
            f"{MIN_GRACE.total_seconds() / 3600:g} h, because an attempt's objects are uploaded "
            "before the commit that names them, and a shorter grace could delete them in "
            "between (the ledger then names objects that are gone)",
        )
    now = now or datetime.now(UTC)
    journal = collect_journal(
        store.published.shared,
        lambda: lineages_in_use(
            (key, status, lineage) for key, (status, lineage) in ledger.journal_lineages().items()
        ),
        now=now,
        grace=grace,
        dry_run=dry_run,
    )
    cache = scratch_cache_of(store)
    if cache is None:
        return GarbageReport(store.location, dry_run, grace.total_seconds(), NOTHING, journal)
    # The listing first (seconds on a big bucket, while runs go on), the rows after it, right
    # before deleting: a step published while the bucket was listed is named by then.
    listed = list(cache.bucket.attempts())
    references = ledger.references()
    manifests = [Manifest.decode(text, where="a ledger pointer") for text in references.pointers]
    # A running step may be uploading an attempt it has not published yet: its whole step
    # prefix is kept, whatever the grace period (a step running for longer than it).
    running = [cache.bucket.step_prefix(key) for key in references.running]
    collection = cache.bucket.collect(
        manifests,
        running,
        now=now,
        grace=grace,
        dry_run=dry_run,
        attempts=listed,
    )
    return GarbageReport(store.location, dry_run, grace.total_seconds(), collection, journal)
