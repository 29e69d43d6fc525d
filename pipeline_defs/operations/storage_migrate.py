"""``storyboard storage migrate --to URL``: move a home's checkpoints into object storage.

Run against the local home (``PIPELINE_STORAGE_URL`` unset), while no step runs. For each
settled row (completed, partial, not applicable) that publishes no pointer yet, the local
checkpoint is loaded and verified as a run verifies it (envelope, content hash, every
artifact's sha256); its objects are put create-only under an attempt of their own, read
back and verified against the manifest, and only then does the row get the manifest as its
commit pointer (``LedgerStore.adopt_pointer``: refused while the row runs or once it has
one). A review's write-ahead edits go along. Nothing local is changed or deleted, so the
home stays a complete fallback until the operator switches ``PIPELINE_STORAGE_URL``; a
second run migrates only what the first did not (docs/DESIGN.md#storage).
"""

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.files import read_nofollow
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import SETTLED_RESULT, StepStatus
from resources.checkpoints.bucket import BucketCheckpoints
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.published import published_checkpoints, scratch_cache_of
from resources.checkpoints.scratch_cache import companion_files
from resources.storage import Storage, open_storage

MIGRATED_STATUSES = frozenset({*SETTLED_RESULT, StepStatus.NOT_APPLICABLE})


@dataclass
class MigrationReport:
    storage: str
    migrated: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # step key -> why
    objects: int = 0
    bytes: int = 0
    pending_edits: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _NoPointers:
    """Pointers for the write-ahead copies only (they are not read back through rows)."""

    def pointer(self, key: StepKey) -> str | None:
        return None

    def episode_pointers(self, project_id: str, episode_id: str) -> Mapping[str, str | None]:
        return {}

    def archived_pointers(self, key: StepKey) -> Sequence[str]:
        return ()

    def row_pointer(self, key: StepKey) -> tuple[bool, str | None]:
        return True, None  # never look for an orphan attempt: this store only writes


def migrate_to(ws: Workspace, url: str) -> MigrationReport:
    """Copy every settled checkpoint of the local home to ``url``, verified, and point
    its ledger row at the copy."""
    local = ws.checkpoints
    if scratch_cache_of(local) is not None:
        raise PipelineError(
            ErrorCode.STORAGE_CONFIG,
            f"storage migrate copies a local home into object storage, but this process "
            f"already publishes to {local.location}: run it with PIPELINE_STORAGE_URL unset",
        )
    storage = open_storage(url, home=ws.home)
    if storage.is_local and storage.url == str(ws.home):
        raise PipelineError(ErrorCode.STORAGE_CONFIG, f"{url} is the home itself")
    bucket = BucketCheckpoints(storage)
    report = MigrationReport(storage.url)
    rows = ws.ledger.get_many()
    for key in sorted(rows, key=str):
        row = rows[key]
        if row.checkpoint_pointer is not None:
            report.already.append(str(key))
            continue
        if row.status not in MIGRATED_STATUSES:
            report.skipped[str(key)] = f"ledger status {row.status}: migrate when it settles"
            continue
        try:
            checkpoint = _verified(ws, key)
        except PipelineError as exc:
            report.skipped[str(key)] = f"not migrated, the local copy is broken: {exc}"
            continue
        if checkpoint is None:
            report.skipped[str(key)] = "no checkpoint under the home"
            continue
        pointer, objects, size = _upload(ws, bucket, checkpoint)
        if ws.ledger.adopt_pointer(key, pointer):
            report.migrated.append(str(key))
            report.objects += objects
            report.bytes += size
        else:
            report.skipped[str(key)] = "the row changed while it was copied: run again"
    report.pending_edits = _pending_edits(ws, storage, {key.episode for key in rows})
    return report


def _verified(ws: Workspace, key: StepKey) -> Checkpoint | None:
    """The local checkpoint, verified as a run verifies what it reads."""
    checkpoint = ws.checkpoints.load(key)
    if checkpoint is None:
        return None
    missing, changed = ws.checkpoints.artifact_problems(checkpoint)
    if missing or changed:
        raise PipelineError(
            ErrorCode.IO_INTEGRITY_VIOLATION,
            f"{key}: artifacts are not the published ones: {', '.join([*missing, *changed])}",
        )
    return checkpoint


def _upload(
    ws: Workspace, bucket: BucketCheckpoints, checkpoint: Checkpoint
) -> tuple[str, int, int]:
    """Put the attempt, read it back verified; (pointer, objects, bytes)."""
    key = checkpoint.key
    attempt = bucket.attempt(key, f"migrated|{checkpoint.content_hash}", checkpoint.created_at)
    size = 0
    for artifact in checkpoint.artifacts:
        data = read_nofollow(ws.checkpoints.artifact_path(key, artifact.path))
        attempt.put(artifact.path, data)
        size += len(data)
    attempt.put_companions(companion_files(ws.checkpoints.tree, checkpoint))  # the receipts too
    manifest = attempt.publishable(checkpoint)
    loaded = bucket.load(manifest)  # verified against the manifest, sha256 and content hash
    if loaded is None or loaded.content_hash != checkpoint.content_hash:
        raise PipelineError(
            ErrorCode.IO_INTEGRITY_VIOLATION,
            f"{key}: the copy in {bucket.storage.url} does not read back as published",
        )
    for relative in manifest.artifacts:
        bucket.read_artifact(manifest, relative)  # verified against the manifest
    return manifest.encode(), len(manifest.artifacts) + 1, size + manifest.envelope.size


def _pending_edits(ws: Workspace, storage: Storage, episodes: set[Episode]) -> int:
    """A review's write-ahead edits (a run killed between writing them and settling)."""
    target = published_checkpoints(ws.home, storage, _NoPointers())
    copied = 0
    for step in ws.steps:
        if not step.modifies_checkpoints:
            continue
        for episode in sorted(episodes, key=lambda e: e.partition_key):
            mutator = episode.step(step.step_id)
            for victim in (*step.modifies_checkpoints, step.step_id):
                edit = ws.checkpoints.load_pending(mutator, victim)
                if edit is not None:
                    target.write_pending(mutator, edit)
                    copied += 1
    return copied
