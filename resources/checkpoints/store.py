"""The checkpoint store: one protocol over where checkpoints are published.

Layout (:class:`~pipeline_defs.resume.layout.DataLayout`):
``<home>/checkpoints/<project>/<episode>/<step>/checkpoint.json`` with the step's
artifacts beside it and ``archive/`` below it. Nothing here deletes data: a replaced or
force-cleared checkpoint is moved into the archive first.

:class:`CheckpointStore` owns the protocol every caller speaks (load, stage and fenced
save, archives and force, seals, write-ahead edits) and is composed of two parts:

- a :class:`~resources.checkpoints.tree.CheckpointTree`: the files of one directory
  (paths, the link policy, the envelope reader, archives, the publisher);
- a :class:`Publication`: where a checkpoint is published and how that is read back. The
  home's own directory (:class:`~resources.checkpoints.directory.HomeDirectory`, the files
  are the truth), or a bucket with the tree as this process's scratch cache
  (:class:`~resources.checkpoints.scratch_cache.ScratchCache`, built by
  :func:`~resources.checkpoints.published.published_checkpoints`).

A new backend is a new ``Publication``; a new cache policy changes the scratch cache alone.
"""

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from pipeline_defs.resume.decision_types import CheckpointSummary
from pipeline_defs.resume.identity import FileIdentity
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.directory import HomeDirectory
from resources.checkpoints.envelope import Artifact, Checkpoint
from resources.checkpoints.journal import ReplyJournal
from resources.checkpoints.object_seal import SealDrift
from resources.checkpoints.seal import Seal, identity_of
from resources.checkpoints.staging import Fence, StagedCheckpoint
from resources.checkpoints.tree import CheckpointTree
from resources.storage import Storage


class PendingEdits(Protocol):
    """A mutator's write-ahead edits of its victims, durable before it publishes."""

    def write_pending(self, mutator: StepKey, edited: Checkpoint) -> Path: ...

    def load_pending(self, mutator: StepKey, victim: str) -> Checkpoint | None: ...

    def drop_pending(self, mutator: StepKey, victim: str) -> None: ...


class Publication(Protocol):
    """Where a store's checkpoints are published, and how they are read back."""

    @property
    def location(self) -> str:
        """Where checkpoints are published, for messages (secrets masked)."""
        ...

    @property
    def poolable(self) -> bool:
        """Whether worker processes may judge from their own store over the same home."""
        ...

    @property
    def shared(self) -> Storage:
        """The storage every machine of the deployment shares (the journal of paid replies
        lives there): the bucket, or the home itself on one disk."""
        ...

    @property
    def scrubbable(self) -> bool:
        """Whether published objects live apart from the ledger and a scrub compares them."""
        ...

    @property
    def scan_layout(self) -> DataLayout:
        """What the sensor's tick ``lstat``s to see a partition change."""
        ...

    @property
    def pending(self) -> PendingEdits: ...

    def judging_scope(self) -> contextlib.AbstractContextManager[None]: ...

    def load(self, key: StepKey) -> Checkpoint | None: ...

    def is_unchanged(self, checkpoint: Checkpoint) -> bool: ...

    def stage(self, checkpoint: Checkpoint) -> StagedCheckpoint: ...

    def sync_inputs(self, project_id: str, episode_id: str | None = None) -> None: ...

    def publish_inputs(self, project_id: str, episode_id: str) -> bool: ...

    def checkout_edit(self, key: StepKey) -> None: ...

    def adoptable_pointer(self, key: StepKey) -> str | None: ...

    def recall(self, key: StepKey) -> Checkpoint | None: ...

    def scrub(
        self, project_id: str, episode_id: str, rows: Mapping[str, tuple[str | None, str | None]]
    ) -> list[SealDrift]: ...

    def seal(
        self,
        checkpoint: Checkpoint,
        reads: Iterable[Path] = (),
        *,
        file: Path | None = None,
        revision: int = 1,
    ) -> str | None: ...

    def sealed(
        self,
        key: StepKey,
        text: Any,
        shared: Callable[[str], FileIdentity | None] = identity_of,
    ) -> Seal | None: ...


class CheckpointStore:
    """All checkpoint operations of one ``PIPELINE_HOME``."""

    def __init__(
        self,
        home: Path,
        *,
        keep_archives: int = 5,
        checkpoints_root: str | None = None,
        publication: Callable[[CheckpointTree], Publication] = HomeDirectory,
    ) -> None:
        self.tree = CheckpointTree(
            home, keep_archives=keep_archives, checkpoints_root=checkpoints_root
        )
        self.published: Publication = publication(self.tree)

    # ------------------------------------------------------------------ where
    @property
    def home(self) -> Path:
        return self.tree.paths.home

    @property
    def layout(self) -> DataLayout:
        return self.tree.paths.layout

    @property
    def root(self) -> Path:
        """The checkpoint tree's root directory (on a bucket: this process's scratch copy)."""
        return self.tree.paths.root

    @property
    def keep_archives(self) -> int:
        return self.tree.archives.keep_archives

    @property
    def location(self) -> str:
        """Where checkpoints are published, for messages."""
        return self.published.location

    @property
    def poolable(self) -> bool:
        """Whether worker processes may judge from their own store over the same home."""
        return self.published.poolable

    @property
    def scrubbable(self) -> bool:
        """Whether published objects live apart from the ledger and a scrub compares them
        (object storage). A local home's seals are re-checked by ``lstat`` instead."""
        return self.published.scrubbable

    @property
    def scan_layout(self) -> DataLayout:
        """What the sensor's tick ``lstat``s to see a partition change: the home itself; on
        object storage nothing of the checkpoint tree (each process's own cache)."""
        return self.published.scan_layout

    def journal(self, key: StepKey, lineage: str, log: logging.Logger) -> ReplyJournal:
        """The paid replies kept for ``key``'s work of ``lineage``
        (docs/DESIGN.md#reply-journal), reported on ``log``."""
        return ReplyJournal(self.published.shared, key, lineage, log)

    def step_dir(self, key: StepKey) -> Path:
        return self.tree.paths.step_dir(key)

    def path_for(self, key: StepKey) -> Path:
        return self.tree.paths.path_for(key)

    def force_marker_path(self, key: StepKey) -> Path:
        return self.tree.paths.force_marker_path(key)

    def archive_dir(self, key: StepKey) -> Path:
        return self.tree.paths.archive_dir(key)

    def pending_path(self, mutator: StepKey, victim: str) -> Path:
        return self.tree.paths.pending_path(mutator, victim)

    def artifact_path(self, key: StepKey, relative: str) -> Path:
        """Where an artifact of ``key`` lives; ``checkpoint.symlink`` if a link is on the way."""
        return self.tree.links.artifact_path(key, relative)

    def refuse_links(self, key: StepKey) -> bool:
        return self.tree.links.refuse_links(key)

    def refuse_links_in_tree(self, key: StepKey) -> None:
        self.tree.links.refuse_links_in_tree(key)

    def iter_keys(self) -> Iterator[StepKey]:
        return self.tree.iter_keys()

    def with_companions(self, key: StepKey, artifacts: Iterable[str]) -> list[str]:
        """Each artifact and the files beside it named after it (its receipt)."""
        return self.tree.with_companions(key, artifacts)

    def not_regular(self, key: StepKey, relatives: Iterable[str]) -> tuple[Path, int] | None:
        """The first of ``relatives`` that exists and is not a regular file, with its mode."""
        return self.tree.not_regular(key, relatives)

    def artifact_sha256(self, key: StepKey, relative: str) -> str | None:
        """The sha256 of an artifact's bytes now; None when absent or not a file."""
        return self.tree.artifact_sha256(key, relative)

    def episode_input_files(self, key: StepKey) -> list[Path]:
        """The regular files directly in ``key``'s episode input directory, sorted; [] when
        it cannot be listed."""
        return self.tree.episode_input_files(key)

    # ------------------------------------------------------------------ reads
    def judging_scope(self) -> contextlib.AbstractContextManager[None]:
        """Read-only judging of many keys: what does not change within one judgement is
        checked once per scope (see :meth:`LinkPolicy.judging_scope`)."""
        return self.published.judging_scope()

    def load(self, key: StepKey) -> Checkpoint | None:
        """The checkpoint, None if there is none, or a typed integrity error naming the file."""
        return self.published.load(key)

    def summary(self, key: StepKey) -> CheckpointSummary:
        checkpoint = self.load(key)
        return checkpoint.summary() if checkpoint is not None else CheckpointSummary.absent()

    def check_artifacts(self, checkpoint: Checkpoint) -> list[str]:
        """Artifacts listed by the envelope that are absent or whose bytes changed."""
        return self.tree.envelopes.check_artifacts(checkpoint)

    def artifact_problems(self, checkpoint: Checkpoint) -> tuple[list[str], list[str]]:
        """(absent artifacts, artifacts whose bytes no longer match the stored sha256)."""
        return self.tree.envelopes.artifact_problems(checkpoint)

    def is_unchanged(self, checkpoint: Checkpoint) -> bool:
        """Same content as published (then a save writes nothing)."""
        return self.published.is_unchanged(checkpoint)

    # ------------------------------------------------------------------ archives and force
    def has_force_marker(self, key: StepKey) -> bool:
        return self.tree.archives.has_force_marker(key)

    def archive(self, key: StepKey, reason: str) -> Path | None:
        return self.tree.archives.archive(key, reason)

    def archived_artifacts(self, key: StepKey) -> dict[str, set[str]]:
        """Artifact file name -> the sha256 prefixes of its archived copies."""
        return self.tree.archives.archived_artifacts(key)

    def archive_artifact(self, key: StepKey, relative: str) -> Path | None:
        return self.tree.archives.archive_artifact(key, relative)

    def force_clear(self, key: StepKey) -> Path | None:
        return self.tree.archives.force_clear(key)

    # ------------------------------------------------------------------ publish
    def write_artifact(self, key: StepKey, relative: str, payload: bytes) -> Artifact:
        return self.tree.publisher.write_artifact(key, relative, payload)

    def stage(self, checkpoint: Checkpoint) -> StagedCheckpoint:
        """Stage ``checkpoint`` for a fenced commit (on a bucket: its attempt uploaded, the
        manifest carried as the staged ``pointer``)."""
        return self.published.stage(checkpoint)

    def save(self, checkpoint: Checkpoint, fence: Fence | None = None) -> bool:
        """Publish ``checkpoint`` through ``fence`` (the ledger row lock); False if unchanged.

        Identical content is never rewritten. The previous version is archived first.
        """
        if self.is_unchanged(checkpoint):
            return False
        staged = self.stage(checkpoint)
        try:
            if fence is None:
                staged.commit()
            else:
                fence(staged)
        finally:
            staged.discard()
        return True

    # ------------------------------------------------------------------ write-ahead edits
    def write_pending(self, mutator: StepKey, edited: Checkpoint) -> Path:
        """Write ahead an edited victim envelope (durable before the mutator publishes)."""
        return self.published.pending.write_pending(mutator, edited)

    def load_pending(self, mutator: StepKey, victim: str) -> Checkpoint | None:
        return self.published.pending.load_pending(mutator, victim)

    def drop_pending(self, mutator: StepKey, victim: str) -> None:
        self.published.pending.drop_pending(mutator, victim)

    # ------------------------------------------------------------------ inputs
    def sync_inputs(self, project_id: str, episode_id: str | None = None) -> None:
        """Bring the home's copy of the inputs up to date (object storage keeps them)."""
        self.published.sync_inputs(project_id, episode_id)

    def publish_inputs(self, project_id: str, episode_id: str) -> bool:
        """Make the home's inputs the shared truth; True when an object was replaced (the
        seals that recorded the old one must then be cleared)."""
        return self.published.publish_inputs(project_id, episode_id)

    # ------------------------------------------------------------------ what was published
    def checkout_edit(self, key: StepKey) -> None:
        """Make an operator's edit of ``key``'s published checkpoint readable at
        ``path_for(key)``."""
        self.published.checkout_edit(key)

    def adoptable_pointer(self, key: StepKey) -> str | None:
        """The commit pointer a row adopting ``key``'s orphan checkpoint must carry."""
        return self.published.adoptable_pointer(key)

    def recall(self, key: StepKey) -> Checkpoint | None:
        """The checkpoint ``key`` last published before it left service, with the artifacts
        it names brought to where a run looks for them, so a re-run reuses what still
        verifies instead of paying for it again (None where nothing ever leaves the step
        directory: a local home)."""
        return self.published.recall(key)

    def scrub(
        self, project_id: str, episode_id: str, rows: Mapping[str, tuple[str | None, str | None]]
    ) -> list[SealDrift]:
        """Seals of one episode that no longer speak for the storage."""
        return self.published.scrub(project_id, episode_id, rows)

    # ------------------------------------------------------------------ seals
    def seal(
        self,
        checkpoint: Checkpoint,
        reads: Iterable[Path] = (),
        *,
        file: Path | None = None,
        revision: int = 1,
    ) -> str | None:
        """Seal text of a checkpoint its run has just verified clean (None: not sealable)."""
        return self.published.seal(checkpoint, reads, file=file, revision=revision)

    def sealed(
        self,
        key: StepKey,
        text: Any,
        shared: Callable[[str], FileIdentity | None] = identity_of,
    ) -> Seal | None:
        """The seal of ``key``'s checkpoint if it still holds, else None (the judge's hot
        path: see :meth:`HomeDirectory.sealed`)."""
        return self.published.sealed(key, text, shared)
