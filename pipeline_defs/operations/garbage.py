"""``storyboard gc``: delete attempt prefixes on object storage that nothing names.

On a bucket nothing is overwritten: every publish leaves the previous attempt behind, and a
fenced worker's dead attempt stays too. Collection deletes a whole attempt prefix only when
no ledger row names any object in it (current pointers and the archived ones a step keeps),
no running row's step holds it, and its newest object is older than the grace period, so an
attempt still uploading before its publish is never touched. Pending review edits live outside the
checkpoint tree and are never collected (docs/DESIGN.md#storage).
"""

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.checkpoints.bucket import Collection
from resources.checkpoints.manifest import Manifest
from resources.checkpoints.published import PublishedCheckpoints

# Far longer than any upload-to-publish window of a step (its objects go up just before
# its publish), and than any clock skew between a worker and the storage.
DEFAULT_GRACE = timedelta(hours=24)


@dataclass(frozen=True)
class GarbageReport:
    storage: str
    dry_run: bool
    grace_seconds: float
    collection: Collection

    def as_dict(self) -> dict[str, Any]:
        return {
            "storage": self.storage,
            "dry_run": self.dry_run,
            "grace_seconds": self.grace_seconds,
            **asdict(self.collection),
        }


def collect_garbage(
    ws: Workspace,
    *,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    now: datetime | None = None,
) -> GarbageReport:
    """Delete unnamed, old attempt prefixes of the configured object storage."""
    store = ws.checkpoints
    if not isinstance(store, PublishedCheckpoints):
        raise PipelineError(
            ErrorCode.STORAGE_CONFIG,
            "storyboard gc collects checkpoints published on object storage "
            "(PIPELINE_STORAGE_URL); a local home keeps its own archives, nothing to collect",
        )
    if grace < timedelta(0):
        raise PipelineError(ErrorCode.INPUT_INVALID, f"the grace period {grace} is negative")
    references = ws.ledger.references()
    manifests = [Manifest.decode(text, where="a ledger pointer") for text in references.pointers]
    # A running step may be uploading an attempt it has not published yet: its whole step
    # prefix is kept, whatever the grace period (a step running for longer than it).
    running = [store.bucket.step_prefix(key) for key in references.running]
    collection = store.bucket.collect(
        manifests, running, now=now or datetime.now(UTC), grace=grace, dry_run=dry_run
    )
    return GarbageReport(store.location, dry_run, grace.total_seconds(), collection)
