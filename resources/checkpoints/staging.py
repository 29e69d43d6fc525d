"""Publishing a checkpoint: staged beside its target, then renamed into place under a fence.

The envelope is written and fsynced to a temp file in the step directory (not yet
visible); the fence (the ledger row lock) commits it by rename in the transaction that
records the status, so a fenced-out worker never replaces a newer checkpoint. The previous
version is archived first; identical content is never rewritten.
"""

import contextlib
import hashlib
import os
import stat as stat_module
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline_defs.resume.files import fsync_dir, symlink_error
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.archives import Archives
from resources.checkpoints.atomic import atomic_write_bytes, named_errors, removed_on_error
from resources.checkpoints.envelope import Artifact, Checkpoint
from resources.checkpoints.links import LinkPolicy
from resources.checkpoints.paths import StorePaths
from resources.checkpoints.reading import EnvelopeReader
from resources.checkpoints.seal import BACKDATE_NS

# Publishes a staged checkpoint under the ledger row lock: runs ``staged.commit`` and stores
# ``staged.pointer`` (object storage) in the same transaction.
Fence = Callable[["StagedCheckpoint"], Any]


class StagedCheckpoint:
    """A checkpoint written and fsynced beside its target, waiting for a fenced rename."""

    def __init__(
        self,
        temp: Path,
        target: Path,
        on_commit: Callable[[], None],
        pointer: str | None = None,
    ) -> None:
        self.temp = temp
        self.target = target
        self._on_commit = on_commit
        self.committed = False
        # On object storage: the manifest of the uploaded attempt, which the ledger stores
        # in the transaction that commits (the commit pointer); None on a local disk.
        self.pointer = pointer

    def commit(self) -> None:
        # A link planted since staging would be replaced (deleted) by the rename: refuse it.
        with contextlib.suppress(FileNotFoundError):
            if stat_module.S_ISLNK(os.lstat(self.target).st_mode):
                raise symlink_error(self.target, "a checkpoint file")
        os.replace(self.temp, self.target)
        fsync_dir(self.target.parent)
        self.committed = True
        self._on_commit()

    def discard(self) -> None:
        if not self.committed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.temp)


class Publisher:
    """Writes artifacts and stages checkpoints in one checkpoint tree."""

    def __init__(
        self, paths: StorePaths, links: LinkPolicy, envelopes: EnvelopeReader, archives: Archives
    ) -> None:
        self.paths = paths
        self.links = links
        self.envelopes = envelopes
        self.archives = archives

    def write_artifact(self, key: StepKey, relative: str, payload: bytes) -> Artifact:
        path = self.links.artifact_path(key, relative)  # refuses a link on the way or in place
        atomic_write_bytes(path, payload)
        return Artifact(
            path=relative, sha256=hashlib.sha256(payload).hexdigest(), bytes=len(payload)
        )

    def stage(self, checkpoint: Checkpoint) -> StagedCheckpoint:
        """Write the envelope to a temp file beside its target (fsynced, not yet visible).

        Any failure before the staged checkpoint is returned (a full disk, a link found by
        the archive) removes the temp file: only a returned stage leaves one, for
        :meth:`StagedCheckpoint.commit` or :meth:`StagedCheckpoint.discard`.
        """
        key = checkpoint.key
        target = self.paths.path_for(key)
        self.links.refuse_links_in_tree(key)  # before anything is written there
        target.parent.mkdir(parents=True, exist_ok=True)
        self.links.refuse_links(key)  # mkdir may have made the chain: a link raced in meanwhile?
        fd, temp = tempfile.mkstemp(prefix=".checkpoint.", suffix=".tmp", dir=target.parent)
        with named_errors(target), removed_on_error(temp):
            with os.fdopen(fd, "wb") as handle:
                handle.write(checkpoint.to_json().encode("utf-8"))
                handle.flush()
                # mtime one second in the past: any later in-place write moves it, so the
                # file's identity can seal it at once (see resources.checkpoints.seal).
                past = time.time_ns() - BACKDATE_NS
                os.utime(handle.fileno(), ns=(past, past))
                os.fsync(handle.fileno())
            current = self.links.lstat_ours(target, "a checkpoint file")
            if current is not None and stat_module.S_ISREG(current.st_mode):
                # even an unreadable one: it is evidence, never destroyed
                self.archives.archive(key, "replaced")

        def after_commit() -> None:
            marker = self.paths.force_marker_path(key)
            with contextlib.suppress(FileNotFoundError):
                # A link planted after the check stays in place: the next load blocks on it.
                if not stat_module.S_ISLNK(os.lstat(marker).st_mode):
                    marker.unlink()
            self.envelopes.forget(target)

        return StagedCheckpoint(Path(temp), target, after_commit)
