"""Reading checkpoints: the envelope, loaded and verified, cached by its stat identity.

``load`` (the long way) refuses a link on the way (:mod:`resources.checkpoints.links`),
parses the envelope and keeps it in memory while the file's ``(mtime_ns, size, inode)``
stays the same, so a judge reading the same checkpoint again pays one ``lstat``.
"""

import json
import os
import stat as stat_module
import threading
from pathlib import Path

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.decision_types import CheckpointSummary
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.files import file_sha256, read_nofollow, symlink_error
from pipeline_defs.resume.identity import FileIdentity, stat_identity
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.links import LinkPolicy
from resources.checkpoints.paths import StorePaths

# Envelopes kept in memory per store (about 13 KB each for the storyboard steps).
MAX_CACHED_ENVELOPES = 20_000


class EnvelopeReader:
    """Loads the envelopes of one checkpoint tree (and checks their artifacts), cached by
    their stat identity."""

    def __init__(self, paths: StorePaths, links: LinkPolicy) -> None:
        self.paths = paths
        self.links = links
        self._cache: dict[Path, tuple[FileIdentity, Checkpoint]] = {}
        self._cache_lock = threading.Lock()

    def cached(self, path: Path) -> tuple[FileIdentity, Checkpoint] | None:
        """The envelope last loaded from ``path`` with the identity it had, if kept."""
        with self._cache_lock:
            return self._cache.get(path)

    def forget(self, path: Path) -> None:
        """Drop what was loaded from ``path`` (it was replaced or taken out of service)."""
        with self._cache_lock:
            self._cache.pop(path, None)

    def _broken(
        self, path: Path, problem: str, origin: Origin = Origin.CONTRACT_DRIFT
    ) -> PipelineError:
        return PipelineError(
            ErrorCode.IO_INTEGRITY_VIOLATION,
            f"checkpoint {path}: {problem}",
            origin=origin.value,
            details={"path": str(path)},
        )

    def load(self, key: StepKey) -> Checkpoint | None:
        """The checkpoint, None if there is none, or a typed integrity error naming the file."""
        path = self.paths.path_for(key)
        self.links.refuse_links(key)
        try:
            stat = os.lstat(path)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            culprit = next(
                (p for p in reversed(path.parents) if p.exists() and not p.is_dir()), path.parent
            )
            raise self._broken(path, f"{culprit} is a file where a directory is expected") from None
        if stat_module.S_ISLNK(stat.st_mode):
            raise symlink_error(path, "a checkpoint file")
        if not stat_module.S_ISREG(stat.st_mode):
            raise self._broken(path, "is not a regular file")
        identity = stat_identity(stat)
        with self._cache_lock:
            cached = self._cache.get(path)
        if cached is not None and cached[0] == identity:
            return cached[1]
        try:
            raw = json.loads(read_nofollow(path).decode("utf-8"))
        except UnicodeDecodeError:
            raise self._broken(path, "is not UTF-8 text") from None
        except json.JSONDecodeError as exc:
            raise self._broken(
                path, f"is not valid JSON (truncated or corrupt: {exc.msg} at {exc.pos})"
            ) from None
        checkpoint = Checkpoint.from_dict(raw, source=str(path))
        if checkpoint.key != key:
            raise self._broken(path, f"belongs to {checkpoint.key}, not {key}")
        with self._cache_lock:
            if len(self._cache) >= MAX_CACHED_ENVELOPES:
                # Oldest first (dicts keep insertion order): bounded memory in the sensor.
                for stale in list(self._cache)[: MAX_CACHED_ENVELOPES // 4]:
                    del self._cache[stale]
            self._cache[path] = (identity, checkpoint)
        return checkpoint

    def summary(self, key: StepKey) -> CheckpointSummary:
        checkpoint = self.load(key)
        return checkpoint.summary() if checkpoint is not None else CheckpointSummary.absent()

    def check_artifacts(self, checkpoint: Checkpoint) -> list[str]:
        """Artifacts listed by the envelope that are absent or whose bytes changed."""
        missing, changed = self.artifact_problems(checkpoint)
        return [*missing, *changed]

    def artifact_problems(self, checkpoint: Checkpoint) -> tuple[list[str], list[str]]:
        """(absent artifacts, artifacts whose bytes no longer match the stored sha256).

        Absent is ``artifact_missing``; present but different is ``invariant_drift`` (a stored
        hash ≠ the recomputed hash), which must block rather than be silently regenerated.
        A link in an artifact's place raises ``checkpoint.symlink`` (contract drift).
        """
        missing: list[str] = []
        changed: list[str] = []
        for artifact in checkpoint.artifacts:
            path = self.links.artifact_path(checkpoint.key, artifact.path)
            if not path.is_file():
                missing.append(f"{artifact.path} (missing)")
            elif path.stat().st_size != artifact.bytes or file_sha256(path) != artifact.sha256:
                changed.append(f"{artifact.path} (sha256 mismatch)")
        return missing, changed

    def is_unchanged(self, checkpoint: Checkpoint) -> bool:
        """The envelope in place has the same identity as ``checkpoint``."""
        try:
            current = self.load(checkpoint.key)
        except PipelineError:
            return False
        return current is not None and current.identity_hash == checkpoint.identity_hash
