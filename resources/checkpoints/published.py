"""Checkpoints published as objects (a bucket), worked on in a scratch copy.

With ``PIPELINE_STORAGE_URL`` set, the truth is the storage plus the ledger: each step's
published checkpoint is the manifest in its row (``step_run.checkpoint_pointer``), naming
immutable objects of one attempt (:mod:`resources.checkpoints.bucket`). ``PIPELINE_HOME``
is scratch: a worker, the sensor or the CLI keeps there a copy of what it read, so that
the steps, the verifiers and the run protocol keep working on plain files, exactly as on
one shared disk. The copy is a cache that any machine can lose; nothing is only there.

- **Read** (:meth:`ScratchCache.load`): the row's pointer names the manifest; the
  scratch copy of the step is brought to it (the envelope and each artifact fetched and
  verified against the manifest's sha256 and size) before the usual load and
  verification. An object deleted from the bucket is absent in scratch
  (``artifact_missing``: a self-only re-run); replaced bytes are ``io.integrity_violation``
  naming the object (a block). A marker per step directory names the pointer the copy
  holds; the copy is kept, with no download, while the storage still holds the very
  objects the manifest names (one LIST of the step's prefix): an object replaced behind
  the ledger's back is seen, never the stale copy. No pointer: nothing is published (the
  scratch is not consulted).
- **Publish** (:meth:`ScratchCache.stage`): the envelope is staged in scratch as
  on disk, then every artifact it lists is put create-only under an attempt prefix of
  the publication's own (never one an earlier publication wrote, whatever its content),
  or named from the previous manifest when its bytes are unchanged (copy-free reuse), the
  envelope last; the staged checkpoint carries the manifest as its ``pointer``, which the
  ledger stores in the owner-aware transaction that commits it. A fenced worker only
  ever wrote into its own attempt, and its transaction matches no row.
- **Write-ahead edits** of a mutator live in the storage (``pending/…``): another machine
  settles them after a crash.

Adapters stay independent: the pointers come from a :class:`PointerSource` the caller
(``resources/pipeline.py``) builds over the ledger.
"""

import os
import socket
from pathlib import Path
from uuid import uuid4

from pipeline_defs.resume.layout import DataLayout
from resources.checkpoints.pointer_source import PointerSource
from resources.checkpoints.scratch_cache import ScratchCache
from resources.checkpoints.store import CheckpointStore
from resources.checkpoints.tree import CheckpointTree
from resources.storage import Storage


def published_checkpoints(
    home: Path, storage: Storage, pointers: PointerSource, *, keep_archives: int = 5
) -> CheckpointStore:
    """The checkpoint store over object storage, with a scratch tree of this process's own
    under ``home`` (``DataLayout.process_scratch``) as its cache."""
    process = f"{socket.gethostname()}-{os.getpid()}-{uuid4().hex[:8]}"
    home_layout = DataLayout.of(home)
    scratch = Path(home_layout.process_scratch(process))

    def over_bucket(tree: CheckpointTree) -> ScratchCache:
        return ScratchCache(tree, storage, pointers, scratch)

    return CheckpointStore(
        home,
        keep_archives=keep_archives,
        checkpoints_root=home_layout.scratch_checkpoints(process),
        publication=over_bucket,
    )


def scratch_cache_of(store: CheckpointStore) -> ScratchCache | None:
    """The scratch cache of a store over object storage; None for a local home."""
    published = store.published
    return published if isinstance(published, ScratchCache) else None
