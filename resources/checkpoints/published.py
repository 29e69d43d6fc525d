"""Checkpoints published as objects (a bucket), worked on in a scratch copy.

With ``PIPELINE_STORAGE_URL`` set, the truth is the storage plus the ledger: each step's
published checkpoint is the manifest in its row (``step_run.checkpoint_pointer``), naming
immutable objects of one attempt (:mod:`resources.checkpoints.bucket`). ``PIPELINE_HOME``
is scratch: a worker, the sensor or the CLI keeps there a copy of what it read, so that
the steps, the verifiers and the run protocol keep working on plain files, exactly as on
one shared disk. The copy is a cache that any machine can lose; nothing is only there.

- **Read** (:meth:`PublishedCheckpoints.load`): the row's pointer names the manifest; the
  scratch copy of the step is brought to it (the envelope and each artifact fetched and
  verified against the manifest's sha256 and size) before the usual load and
  verification. An object deleted from the bucket is absent in scratch
  (``artifact_missing``: a self-only re-run); replaced bytes are ``io.integrity_violation``
  naming the object (a block). A marker per step directory names the pointer the copy
  holds; the copy is kept, with no download, while the storage still holds the very
  objects the manifest names (one LIST of the step's prefix): an object replaced behind
  the ledger's back is seen, never the stale copy. No pointer: nothing is published (the
  scratch is not consulted).
- **Publish** (:meth:`PublishedCheckpoints.stage`): the envelope is staged in scratch as
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

# PUBLISHED_MARKER (DataLayout.published_marker) names the pointer a scratch step directory
# holds a verified copy of (sha256 of its text); SCRATCH_DIR (DataLayout.scratch_dir) holds
# the per-process copies, never the truth. Both re-exported for their callers.
from pipeline_defs.resume.layout import PUBLISHED_MARKER, SCRATCH_DIR
from resources.checkpoints.published_copies import UNSCANNED, PointerSource, PublishedCopies
from resources.checkpoints.published_inputs import INPUTS_MAX_AGE_SECONDS, PublishedInputs
from resources.checkpoints.published_pending import PublishedPending
from resources.checkpoints.published_seals import PublishedSeals

__all__ = [
    "INPUTS_MAX_AGE_SECONDS",
    "PUBLISHED_MARKER",
    "SCRATCH_DIR",
    "UNSCANNED",
    "PointerSource",
    "PublishedCheckpoints",
    "PublishedCopies",
    "PublishedInputs",
    "PublishedPending",
    "PublishedSeals",
]


class PublishedCheckpoints(PublishedPending, PublishedSeals):
    """The checkpoint store over object storage, with ``home`` as scratch.

    Assembled from modules of one concern each: the scratch copies, reads and publication
    (:mod:`~resources.checkpoints.published_copies`), the inputs
    (:mod:`~resources.checkpoints.published_inputs`), the seals and the scrub
    (:mod:`~resources.checkpoints.published_seals`), and the write-ahead edits
    (:mod:`~resources.checkpoints.published_pending`).
    """
