"""Checkpoints published in the home's own directory: the files are the truth.

The :class:`~resources.checkpoints.store.Publication` of a local disk (or one shared
mount): a checkpoint is published when its envelope is renamed into place under the fence,
so reading one is reading the file, and its seal names the files it covers by their
``lstat`` identity (:mod:`resources.checkpoints.seal`). Object storage publishes
elsewhere and keeps this tree as scratch (:mod:`resources.checkpoints.scratch_cache`).

Cost on the judge's hot path: :meth:`HomeDirectory.sealed` (a clean, sealed checkpoint)
``lstat``-s the directories from the home to the step (the ancestors once per judging
scope) and the artifact directories, and matches the envelope and artifacts by ``lstat``
identity; it scans no directory. ``load`` (the long way) also scans the entries of the step
directory, once and then trusted while that directory's own ``(mtime_ns, inode)`` stays the
same (creating, renaming or replacing an entry moves it).
"""

import contextlib
import os
import stat as stat_module
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.identity import FileIdentity
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.object_seal import SealDrift
from resources.checkpoints.paths import artifact_dirs
from resources.checkpoints.pending import PendingFiles
from resources.checkpoints.seal import Seal, identity_of, make_seal
from resources.checkpoints.staging import StagedCheckpoint
from resources.checkpoints.tree import CheckpointTree
from resources.storage.local import LocalStorage


class HomeDirectory:
    """Publication in the home's checkpoint tree itself."""

    poolable = True  # worker processes may judge from their own store over the same home
    scrubbable = False  # a local home's seals are re-checked by lstat, not by a scrub

    def __init__(self, tree: CheckpointTree) -> None:
        self.tree = tree
        self.pending = PendingFiles(tree.paths, tree.links)
        # The home is what every process shares here: the journal of paid replies too.
        self.shared = LocalStorage(tree.paths.home)

    @property
    def location(self) -> str:
        """Where checkpoints are published, for messages."""
        return str(self.tree.paths.root)

    @property
    def scan_layout(self) -> DataLayout:
        """What the sensor's tick ``lstat``s to see a partition change: the home itself."""
        return self.tree.paths.layout

    def judging_scope(self) -> contextlib.AbstractContextManager[None]:
        return self.tree.links.judging_scope()

    def load(self, key: StepKey) -> Checkpoint | None:
        return self.tree.envelopes.load(key)

    def is_unchanged(self, checkpoint: Checkpoint) -> bool:
        return self.tree.envelopes.is_unchanged(checkpoint)

    def stage(self, checkpoint: Checkpoint) -> StagedCheckpoint:
        return self.tree.publisher.stage(checkpoint)

    # ------------------------------------------------------------------ inputs
    def sync_inputs(self, project_id: str, episode_id: str | None = None) -> None:
        """Nothing to bring: the home's inputs are the truth here."""

    def publish_inputs(self, project_id: str, episode_id: str) -> bool:
        """Nothing to publish: the home's inputs already are the shared truth (and its seals
        see a changed input by its stat identity: nothing to clear)."""
        return False

    # ------------------------------------------------------------------ what was published
    def checkout_edit(self, key: StepKey) -> None:
        """An operator's edit is already readable at ``path_for(key)``: the file they edited."""

    def adoptable_pointer(self, key: StepKey) -> str | None:
        """None: the file is the checkpoint, a row adopting it carries no pointer."""
        return None

    def recall(self, key: StepKey) -> Checkpoint | None:
        """None: on a local home the artifact files never leave the step directory (a force
        archives only the envelope; each picture keeps its receipt)."""
        return None

    def scrub(
        self, project_id: str, episode_id: str, rows: Mapping[str, tuple[str | None, str | None]]
    ) -> list[SealDrift]:
        """Seals that no longer speak for the storage: none (seals re-check by ``lstat``)."""
        return []

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
        paths = self.tree.paths
        expected: FileIdentity | None = None
        if file is None:
            cached = self.tree.envelopes.cached(paths.path_for(checkpoint.key))
            if cached is None or cached[1] is not checkpoint:
                return None  # not loaded through this store (or evicted): stay unsealed
            expected = cached[0]
        sealed = make_seal(
            home=paths.home,
            checkpoint_file=file or paths.path_for(checkpoint.key),
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
        (``load``, the verifier) then reports it as a typed block.

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
        paths, links = self.tree.paths, self.tree.links
        # The strings DataLayout.checkpoint_episode_dir / step_dir / checkpoint_file spell,
        # joined here: a method call or a cached chain per step costs more than the join on
        # a cold tick (every step of every episode, seen once).
        episode = f"{paths.root_text}/{key.project_id}/{key.episode_id}"
        step = f"{episode}/{key.step_id}"
        scope = links.scope()
        try:
            if scope is not None and episode in scope:
                # Its ancestors were lstat'ed in this judging scope: the step directory only
                # (no chain built: this runs for every step of every episode).
                if not stat_module.S_ISDIR(os.lstat(step).st_mode):
                    return None  # a link (or a file): the long way reports it
            elif links.walk_dirs(paths.chain_of(key)) is None:
                return None
            for relative in artifact_dirs(seal.artifacts) if seal.artifacts else ():
                found = links.lstat_ours(f"{step}/{relative}", "a directory")
                if found is None or not stat_module.S_ISDIR(found.st_mode):
                    return None
        except (PipelineError, FileNotFoundError, NotADirectoryError):
            return None
        # String paths (no pathlib): this runs for every step of every episode on a cold tick.
        checkpoint_in = DataLayout.checkpoint_in
        return seal if seal.holds(paths.home_text, checkpoint_in(step), shared) else None
