"""Checkpoint files: atomic writes, fenced publication, archives, force markers.

Layout (:class:`~pipeline_defs.resume.layout.DataLayout`):
``<home>/checkpoints/<project>/<episode>/<step>/checkpoint.json`` with the step's
artifacts beside it and ``archive/`` below it. Nothing here deletes data: a replaced or
force-cleared checkpoint is moved into the archive first.

:class:`CheckpointStore` is assembled from modules of one concern each, one layer on the
other (a method found on the class costs no more than one defined here):

- :mod:`~resources.checkpoints.paths`: a step's paths by key (``StorePaths``);
- :mod:`~resources.checkpoints.links`: the symlink policy, no escape from the home
  (docs/DESIGN.md#no-escape) (``LinkPolicy``);
- :mod:`~resources.checkpoints.reading`: loading, the envelope cache (``CheckpointReader``);
- :mod:`~resources.checkpoints.archives`: archives and force (``ArchiveKeeper``);
- :mod:`~resources.checkpoints.staging`: staging and fenced publication (``Publisher``);
- :mod:`~resources.checkpoints.pending`: a mutator's write-ahead edits (``PendingEdits``);
- here: seals (writing one, and :meth:`CheckpointStore.sealed`, the judge's hot path), the
  home-level hooks object storage overrides, and listing the keys.

Cost on the judge's hot path: ``sealed`` (a clean, sealed checkpoint) ``lstat``-s the
directories from the home to the step (the ancestors once per judging scope) and the
artifact directories, and matches the envelope and artifacts by ``lstat`` identity; it
scans no directory (see :meth:`CheckpointStore.sealed`). ``load`` (the long way) also scans
the entries of the step directory, once and then trusted while that directory's own
``(mtime_ns, inode)`` stays the same (creating, renaming or replacing an entry moves it).
"""

import os
import stat as stat_module
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.files import (  # re-exported: the store's callers use them
    SYMLINK_CODE,
    file_sha256,
    fsync_dir,
    read_nofollow,
    symlink_error,
)
from pipeline_defs.resume.identity import FileIdentity
from pipeline_defs.resume.layout import (  # re-exported: the store's callers use them
    ARCHIVE_DIR,
    CHECKPOINT_FILE,
    FORCE_MARKER,
    PENDING_DIR,
    DataLayout,
)
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.atomic import atomic_write_bytes
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.links import MAX_CLEAN_DIRS
from resources.checkpoints.object_seal import SealDrift
from resources.checkpoints.paths import artifact_dirs
from resources.checkpoints.pending import PendingEdits
from resources.checkpoints.reading import MAX_CACHED_ENVELOPES
from resources.checkpoints.seal import Seal, identity_of, make_seal
from resources.checkpoints.staging import Fence, Publisher, StagedCheckpoint

__all__ = [
    "ARCHIVE_DIR",
    "CHECKPOINT_FILE",
    "FORCE_MARKER",
    "MAX_CACHED_ENVELOPES",
    "MAX_CLEAN_DIRS",
    "PENDING_DIR",
    "SYMLINK_CODE",
    "CheckpointStore",
    "Fence",
    "StagedCheckpoint",
    "atomic_write_bytes",
    "file_sha256",
    "fsync_dir",
    "read_nofollow",
    "symlink_error",
]


class CheckpointStore(PendingEdits, Publisher):
    """All checkpoint file operations of one ``PIPELINE_HOME``."""

    def __init__(
        self, home: Path, *, keep_archives: int = 5, checkpoints_root: str | None = None
    ) -> None:
        super().__init__(home, keep_archives=keep_archives, checkpoints_root=checkpoints_root)

    @property
    def poolable(self) -> bool:
        """Whether worker processes may judge from their own store over the same home."""
        return True

    @property
    def location(self) -> str:
        """Where checkpoints are published, for messages."""
        return str(self.root)

    # ------------------------------------------------------------------ inputs
    def sync_inputs(self, project_id: str, episode_id: str | None = None) -> None:
        """Bring the home's copy of the inputs up to date: nothing to do, they are the
        truth here (object storage keeps them, see ``PublishedCheckpoints``)."""

    def checkout_edit(self, key: StepKey) -> None:
        """Make an operator's edit of ``key``'s published checkpoint readable at
        ``path_for(key)``: it already is on a local home (the file they edited)."""

    def adoptable_pointer(self, key: StepKey) -> str | None:
        """The commit pointer a row adopting ``key``'s orphan checkpoint must carry: none
        on a local home (the file is the checkpoint); on object storage the manifest of the
        attempt ``load`` found when the row was lost (``PublishedCopies``)."""
        return None

    def recall(self, key: StepKey) -> Checkpoint | None:
        """The checkpoint ``key`` last published before it left service (a force archived
        it), with the artifacts it names brought to where a run looks for them, so a re-run
        reuses what still verifies instead of paying for it again. None here: on a local
        home the artifact files never leave the step directory (a force archives only the
        envelope; each picture keeps its receipt), see ``PublishedCopies.recall``."""
        return None

    @property
    def scan_layout(self) -> DataLayout:
        """What the sensor's tick ``lstat``s to see a partition change: the home itself.
        On object storage the checkpoint tree is each process's own cache (see
        ``PublishedCheckpoints.scan_layout``)."""
        return self.layout

    @property
    def scrubbable(self) -> bool:
        """Whether published objects live apart from the ledger and a scrub compares them
        (object storage). A local home's seals are re-checked by ``lstat`` instead."""
        return False

    def scrub(
        self, project_id: str, episode_id: str, rows: Mapping[str, tuple[str | None, str | None]]
    ) -> list[SealDrift]:
        """Seals of one episode that no longer speak for the storage: none here."""
        return []

    def publish_inputs(self, project_id: str, episode_id: str) -> bool:
        """Make the home's inputs the shared truth: they already are on a local home (and
        its seals see a changed input by its stat identity: nothing to clear)."""
        return False

    # ------------------------------------------------------------------ seals
    def seal(
        self,
        checkpoint: Checkpoint,
        reads: Iterable[Path] = (),
        *,
        file: Path | None = None,
        revision: int = 1,
    ) -> str | None:
        """Seal text of a checkpoint its run has just verified clean (None: not sealable).

        ``file`` is where the envelope is now (a staged temp file keeps its identity when it
        is renamed into place); default the published checkpoint, which must then still be
        the very file ``checkpoint`` was loaded from (else a concurrent rewrite could get
        the verdict of the version that was verified). ``reads``: the other files the
        step's verifier reads; ``revision``: the step's ``verify_revision``.
        """
        expected: FileIdentity | None = None
        if file is None:
            with self._cache_lock:
                cached = self._cache.get(self.path_for(checkpoint.key))
            if cached is None or cached[1] is not checkpoint:
                return None  # not loaded through this store (or evicted): stay unsealed
            expected = cached[0]
        sealed = make_seal(
            home=self.home,
            checkpoint_file=file or self.path_for(checkpoint.key),
            expected=expected,
            summary=checkpoint.summary(),
            version=checkpoint.version,
            artifacts={a.path: a.sha256 for a in checkpoint.artifacts},
            reads=tuple(reads),
            sealed_ns=time.time_ns(),
            revision=revision,
        )
        return None if sealed is None else sealed.encode()

    def sealed(
        self,
        key: StepKey,
        text: Any,
        shared: Callable[[str], FileIdentity | None] = identity_of,
    ) -> Seal | None:
        """The seal of ``key``'s checkpoint if every file it names is unchanged, else None.

        ``shared``: how to stat the project/episode inputs (see :meth:`Seal.holds`). A link
        on the way to the checkpoint or its artifacts voids the seal: the long way
        (:meth:`load`, the verifier) then reports it as a typed block.

        Links are checked only where the verdict reads (docs/DESIGN.md#no-escape): every
        directory from the home down to the step and artifact directories is ``lstat``-ed
        (a link there is followed by any path below it), and the envelope and artifacts
        are matched by their ``lstat`` identity, which a link in their place never has.
        The entries the seal does not cover (``archive/``, ``pending/``, the force marker,
        a receipt beside an artifact) are not scanned: the sealed verdict reads none of
        them, and every writer refuses a link anywhere in the step directory before it
        writes (``refuse_links_in_tree``). See BENCHMARKS.md, "Sensor tick", for the cost.
        """
        seal = Seal.decode(text)
        if seal is None:
            return None
        # The strings DataLayout.checkpoint_episode_dir / step_dir / checkpoint_file spell,
        # joined here: a method call or a cached chain per step costs more than the join on
        # a cold tick (every step of every episode, seen once).
        episode = f"{self._root}/{key.project_id}/{key.episode_id}"
        step = f"{episode}/{key.step_id}"
        scope: set[str] | None = getattr(self._local, "scope", None)
        try:
            if scope is not None and episode in scope:
                # Its ancestors were lstat'ed in this judging scope: the step directory only
                # (no chain built: this runs for every step of every episode).
                if not stat_module.S_ISDIR(os.lstat(step).st_mode):
                    return None  # a link (or a file): the long way reports it
            elif self._walk_dirs(self._chain_of(key)) is None:
                return None
            for relative in artifact_dirs(seal.artifacts) if seal.artifacts else ():
                found = self._lstat_ours(f"{step}/{relative}", "a directory")
                if found is None or not stat_module.S_ISDIR(found.st_mode):
                    return None
        except (PipelineError, FileNotFoundError, NotADirectoryError):
            return None
        # String paths (no pathlib): this runs for every step of every episode on a cold tick.
        checkpoint_in = DataLayout.checkpoint_in
        return seal if seal.holds(self._home, checkpoint_in(step), shared) else None

    def iter_keys(self) -> Iterator[StepKey]:
        """Every step directory holding a checkpoint (for adoption and audits).

        Walked without following links: a linked project, episode or step directory is not
        listed through the link, but a linked step directory is yielded (by name) so that
        loading it reports the link.
        """

        def real_dirs(path: str) -> list[os.DirEntry[str]]:
            try:
                with os.scandir(path) as entries:
                    return sorted(
                        (e for e in entries if e.is_dir(follow_symlinks=False) or e.is_symlink()),
                        key=lambda e: e.name,
                    )
            except (FileNotFoundError, NotADirectoryError):
                return []

        if self._lstat_ours(self.root, "a directory") is None:
            return
        for project in real_dirs(self._root):
            if project.is_symlink():
                continue
            for episode in real_dirs(project.path):
                if episode.is_symlink():
                    continue
                for step in real_dirs(episode.path):
                    if step.is_symlink() or os.path.lexists(DataLayout.checkpoint_in(step.path)):
                        yield StepKey(project.name, episode.name, step.name)
