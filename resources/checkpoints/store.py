"""Checkpoint files: atomic writes, fenced publication, archives, force markers.

Layout: ``<home>/checkpoints/<project>/<episode>/<step>/checkpoint.json`` with the step's
artifacts beside it and ``archive/`` below it. Nothing here deletes data: a replaced or
force-cleared checkpoint is moved into the archive first.
"""

import contextlib
import hashlib
import json
import os
import stat as stat_module
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.decision import CheckpointSummary
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.envelope import Artifact, Checkpoint
from resources.checkpoints.seal import BACKDATE_NS, FileIdentity, Seal, identity_of, make_seal

CHECKPOINT_FILE = "checkpoint.json"
FORCE_MARKER = ".force_cleared"
ARCHIVE_DIR = "archive"
PENDING_DIR = "pending"  # a mutator's write-ahead edits of its victims (steps.mutations)
# Envelopes kept in memory per store (about 13 KB each for the storyboard steps).
MAX_CACHED_ENVELOPES = 20_000

Fence = Callable[[Callable[[], None]], Any]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(target: Path, payload: bytes) -> None:
    """Temp file in the same directory, fsync, rename: readers see old or new, never half."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
        _fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


class StagedCheckpoint:
    """A checkpoint written and fsynced beside its target, waiting for a fenced rename."""

    def __init__(self, temp: Path, target: Path, on_commit: Callable[[], None]) -> None:
        self.temp = temp
        self.target = target
        self._on_commit = on_commit
        self.committed = False

    def commit(self) -> None:
        os.replace(self.temp, self.target)
        _fsync_dir(self.target.parent)
        self.committed = True
        self._on_commit()

    def discard(self) -> None:
        if not self.committed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.temp)


class CheckpointStore:
    """All checkpoint file operations of one ``PIPELINE_HOME``."""

    def __init__(self, home: Path, *, keep_archives: int = 5) -> None:
        self.home = Path(home)
        self.root = self.home / "checkpoints"
        self._home, self._root = str(self.home), str(self.root)
        self.keep_archives = keep_archives
        self._cache: dict[Path, tuple[tuple[int, int, int], Checkpoint]] = {}
        self._cache_lock = threading.Lock()
        # (step dir, checkpoint path) per key: pathlib joins are slow when judging in bulk.
        self._paths: dict[StepKey, tuple[Path, Path]] = {}

    # ------------------------------------------------------------------ paths
    def _paths_of(self, key: StepKey) -> tuple[Path, Path]:
        found = self._paths.get(key)
        if found is None:
            if len(self._paths) >= 200_000:
                self._paths.clear()
            base = f"{self.root}/{key.project_id}/{key.episode_id}/{key.step_id}"
            found = self._paths[key] = (Path(base), Path(f"{base}/{CHECKPOINT_FILE}"))
        return found

    def step_dir(self, key: StepKey) -> Path:
        return self._paths_of(key)[0]

    def path_for(self, key: StepKey) -> Path:
        return self._paths_of(key)[1]

    def artifact_path(self, key: StepKey, relative: str) -> Path:
        path = (self.step_dir(key) / relative).resolve()
        if self.step_dir(key).resolve() not in path.parents:
            raise PipelineError(
                "input.invalid", f"artifact path {relative!r} escapes {self.step_dir(key)}"
            )
        return path

    def has_force_marker(self, key: StepKey) -> bool:
        return (self.step_dir(key) / FORCE_MARKER).exists()

    # ------------------------------------------------------------------ reading
    def _broken(
        self, path: Path, problem: str, origin: Origin = Origin.CONTRACT_DRIFT
    ) -> PipelineError:
        return PipelineError(
            "io.integrity_violation",
            f"checkpoint {path}: {problem}",
            origin=origin.value,
            details={"path": str(path)},
        )

    def load(self, key: StepKey) -> Checkpoint | None:
        """The checkpoint, None if there is none, or a typed integrity error naming the file."""
        path = self.path_for(key)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            culprit = next(
                (p for p in reversed(path.parents) if p.exists() and not p.is_dir()), path.parent
            )
            raise self._broken(path, f"{culprit} is a file where a directory is expected") from None
        if not stat_module.S_ISREG(stat.st_mode):
            raise self._broken(path, "is not a regular file")
        identity = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        with self._cache_lock:
            cached = self._cache.get(path)
        if cached is not None and cached[0] == identity:
            return cached[1]
        try:
            raw = json.loads(path.read_bytes().decode("utf-8"))
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
        """
        missing: list[str] = []
        changed: list[str] = []
        for artifact in checkpoint.artifacts:
            path = self.artifact_path(checkpoint.key, artifact.path)
            if not path.is_file():
                missing.append(f"{artifact.path} (missing)")
            elif path.stat().st_size != artifact.bytes or file_sha256(path) != artifact.sha256:
                changed.append(f"{artifact.path} (sha256 mismatch)")
        return missing, changed

    # ------------------------------------------------------------------ writing
    def write_artifact(self, key: StepKey, relative: str, payload: bytes) -> Artifact:
        path = self.artifact_path(key, relative)
        atomic_write_bytes(path, payload)
        return Artifact(
            path=relative, sha256=hashlib.sha256(payload).hexdigest(), bytes=len(payload)
        )

    def stage(self, checkpoint: Checkpoint) -> StagedCheckpoint:
        """Write the envelope to a temp file beside its target (fsynced, not yet visible)."""
        target = self.path_for(checkpoint.key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=".checkpoint.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(checkpoint.to_json().encode("utf-8"))
            handle.flush()
            # mtime one second in the past: any later in-place write moves it, so the
            # file's identity can seal it at once (see resources.checkpoints.seal).
            past = time.time_ns() - BACKDATE_NS
            os.utime(handle.fileno(), ns=(past, past))
            os.fsync(handle.fileno())

        def after_commit() -> None:
            with contextlib.suppress(FileNotFoundError):
                (target.parent / FORCE_MARKER).unlink()
            with self._cache_lock:
                self._cache.pop(target, None)

        if target.is_file():  # even an unreadable one: it is evidence, never destroyed
            self.archive(checkpoint.key, "replaced")
        return StagedCheckpoint(Path(temp), target, after_commit)

    # ------------------------------------------------------------------ pending mutations
    def pending_path(self, mutator: StepKey, victim: str) -> Path:
        return self.step_dir(mutator) / PENDING_DIR / f"{victim}.json"

    def write_pending(self, mutator: StepKey, edited: Checkpoint) -> Path:
        """Write ahead an edited victim envelope (durable before the mutator publishes)."""
        path = self.pending_path(mutator, edited.step_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, edited.to_json().encode("utf-8"))
        return path

    def load_pending(self, mutator: StepKey, victim: str) -> Checkpoint | None:
        """The written-ahead edit of ``victim``; None if absent or unreadable (never trusted
        beyond its content hash, which the caller compares with the published intent)."""
        path = self.pending_path(mutator, victim)
        try:
            raw = json.loads(path.read_bytes())
            return Checkpoint.from_dict(raw, source=str(path))
        except (OSError, ValueError, PipelineError):
            return None

    def drop_pending(self, mutator: StepKey, victim: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pending_path(mutator, victim).unlink()

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

        ``shared``: how to stat the project/episode inputs (see :meth:`Seal.holds`).
        """
        seal = Seal.decode(text)
        if seal is None:
            return None
        # String paths (no pathlib): this runs for every step of every episode on a cold tick.
        checkpoint = (
            f"{self._root}/{key.project_id}/{key.episode_id}/{key.step_id}/{CHECKPOINT_FILE}"
        )
        return seal if seal.holds(self._home, checkpoint, shared) else None

    def _load_quietly(self, key: StepKey) -> Checkpoint | None:
        try:
            return self.load(key)
        except PipelineError:
            return None

    def is_unchanged(self, checkpoint: Checkpoint) -> bool:
        current = self._load_quietly(checkpoint.key)
        return current is not None and current.identity_hash == checkpoint.identity_hash

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
                fence(staged.commit)
        finally:
            staged.discard()
        return True

    # ------------------------------------------------------------------ archives and force
    def archive(self, key: StepKey, reason: str) -> Path | None:
        """Copy the current checkpoint into ``archive/``; keep the newest ``keep_archives``."""
        source = self.path_for(key)
        if not source.is_file():
            return None
        folder = self.step_dir(key) / ARCHIVE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        stamp = format_timestamp(datetime.now(UTC)).replace(":", "").replace(".", "-")
        target = folder / f"{stamp}-{reason}.json"
        atomic_write_bytes(target, source.read_bytes())
        archives = sorted(folder.glob("*.json"))
        for old in archives[: max(0, len(archives) - self.keep_archives)]:
            old.unlink()
        return target

    def force_clear(self, key: StepKey) -> Path | None:
        """Archive the checkpoint, take it out of service and leave a ``.force_cleared`` marker."""
        archived = self.archive(key, "force")
        step_dir = self.step_dir(key)
        step_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(step_dir / FORCE_MARKER, (archived.name if archived else "").encode())
        path = self.path_for(key)
        if archived is not None and archived.is_file():
            path.unlink(missing_ok=True)  # its bytes are in the archive
        with self._cache_lock:
            self._cache.pop(path, None)
        return archived

    def iter_keys(self) -> Iterator[StepKey]:
        """Every step directory holding a checkpoint (for adoption and audits)."""
        for path in sorted(self.root.glob(f"*/*/*/{CHECKPOINT_FILE}")):
            step_dir = path.parent
            yield StepKey(step_dir.parent.parent.name, step_dir.parent.name, step_dir.name)
