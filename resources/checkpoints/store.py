"""Checkpoint files: atomic writes, fenced publication, archives, force markers.

Layout: ``<home>/checkpoints/<project>/<episode>/<step>/checkpoint.json`` with the step's
artifacts beside it and ``archive/`` below it. Nothing here deletes data: a replaced or
force-cleared checkpoint is moved into the archive first.

No escape from the home (docs/DESIGN.md#no-escape): every path below ``PIPELINE_HOME`` this module
reads, writes, archives, prunes or deletes is checked without following symlinks — each
directory from the home down is ``lstat``-ed, files are opened with ``O_NOFOLLOW``, and the
entries of the directories we work in are scanned. A symlink where a file or directory of
ours should be raises ``checkpoint.symlink`` (origin contract drift, naming the link): the
judge turns that into a visible block, and the link is never followed, replaced or deleted.
The home itself may be a link (an operator's choice of where the data lives).

Cost on the judge's hot path: ``sealed`` (a clean, sealed checkpoint) ``lstat``-s the
directories from the home to the step (the ancestors once per judging scope) and the
artifact directories, and matches the envelope and artifacts by ``lstat`` identity; it
scans no directory (see :meth:`CheckpointStore.sealed`). ``load`` (the long way) also scans
the entries of the step directory, once and then trusted while that directory's own
``(mtime_ns, inode)`` stays the same (creating, renaming or replacing an entry moves it).
"""

import contextlib
import functools
import hashlib
import json
import os
import posixpath
import stat as stat_module
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.decision import CheckpointSummary
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.files import (  # re-exported: the store's callers use them
    SYMLINK_CODE,
    file_sha256,
    fsync_dir,
    read_nofollow,
    symlink_error,
)
from pipeline_defs.resume.layout import DataLayout, FileIdentity, dir_stat_identity, stat_identity
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.envelope import Artifact, Checkpoint
from resources.checkpoints.object_seal import SealDrift
from resources.checkpoints.seal import (
    BACKDATE_NS,
    Seal,
    identity_of,
    is_racy,
    make_seal,
)

CHECKPOINT_FILE = "checkpoint.json"
FORCE_MARKER = ".force_cleared"
ARCHIVE_DIR = "archive"
PENDING_DIR = "pending"  # a mutator's write-ahead edits of its victims (steps.mutations)
# Envelopes kept in memory per store (about 13 KB each for the storyboard steps).
MAX_CACHED_ENVELOPES = 20_000
# Directories whose entries were found free of links (one per step and artifact directory).
MAX_CLEAN_DIRS = 400_000

# Publishes a staged checkpoint under the ledger row lock: runs ``staged.commit`` and stores
# ``staged.pointer`` (object storage) in the same transaction.
Fence = Callable[["StagedCheckpoint"], Any]


@functools.lru_cache(maxsize=4096)
def _artifact_dirs(artifacts: tuple[str, ...]) -> tuple[str, ...]:
    """The directories (relative to the step directory, parents first) holding artifacts."""
    found: dict[str, None] = {}
    for relative in artifacts:
        parts = posixpath.normpath(relative).split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            found.setdefault("/".join(parts[:depth]))
    return tuple(found)


def _naming(exc: BaseException, target: Path) -> OSError | None:
    """``exc`` again with the file it was writing, or None to re-raise it as it is.

    A write through a descriptor (a full disk in ``write`` or ``fsync``) carries no
    filename, and the operator needs to know which file (pipeline_defs.resume.causes).
    """
    if not isinstance(exc, OSError) or exc.filename is not None or exc.errno is None:
        return None
    return type(exc)(exc.errno, exc.strerror, str(target))


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
        fsync_dir(target.parent)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        named = _naming(exc, target)
        if named is not None:
            raise named from exc
        raise


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


class CheckpointStore:
    """All checkpoint file operations of one ``PIPELINE_HOME``."""

    def __init__(
        self, home: Path, *, keep_archives: int = 5, checkpoints_root: str | None = None
    ) -> None:
        self.home = Path(home)
        self.layout = DataLayout(str(self.home), checkpoints_root=checkpoints_root)
        self.root = Path(self.layout.checkpoints)
        self._home, self._root = str(self.home), str(self.root)
        self.keep_archives = keep_archives
        self._cache: dict[Path, tuple[tuple[int, int, int], Checkpoint]] = {}
        self._cache_lock = threading.Lock()
        # (step dir, checkpoint path) per key: pathlib joins are slow when judging in bulk.
        self._paths: dict[StepKey, tuple[Path, Path]] = {}
        # The directories from the home down to each key's step dir, as plain strings: the
        # judge lstats them for every step of every episode (no pathlib on that path).
        self._chains: dict[StepKey, tuple[str, str, str, str]] = {}
        # directory -> its (mtime_ns, inode) when its entries were last found free of links.
        self._clean_dirs: dict[str, tuple[int, int]] = {}
        # Per thread: ancestors of step directories (checkpoints/, project, episode) found to
        # be real directories during the current judging scope (:meth:`judging_scope`).
        self._local = threading.local()

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

    # ------------------------------------------------------------------ paths
    def _paths_of(self, key: StepKey) -> tuple[Path, Path]:
        found = self._paths.get(key)
        if found is None:
            if len(self._paths) >= 200_000:
                self._paths.clear()
            base = self.layout.step_dir(key.project_id, key.episode_id, key.step_id)
            found = self._paths[key] = (Path(base), Path(f"{base}/{CHECKPOINT_FILE}"))
        return found

    def _chain_of(self, key: StepKey) -> tuple[str, str, str, str]:
        """checkpoints root, project, episode and step directory of ``key``."""
        found = self._chains.get(key)
        if found is None:
            if len(self._chains) >= 200_000:
                self._chains.clear()
            layout, p, e = self.layout, key.project_id, key.episode_id
            found = self._chains[key] = (
                self._root,
                layout.checkpoint_project_dir(p),
                layout.checkpoint_episode_dir(p, e),
                layout.step_dir(p, e, key.step_id),
            )
        return found

    def step_dir(self, key: StepKey) -> Path:
        return self._paths_of(key)[0]

    def path_for(self, key: StepKey) -> Path:
        return self._paths_of(key)[1]

    def artifact_path(self, key: StepKey, relative: str) -> Path:
        """Where an artifact of ``key`` lives; ``checkpoint.symlink`` if a link is on the way.

        Lexical, never resolved: resolving would follow the very links refused here.
        """
        normal = posixpath.normpath(relative) if relative else ""
        if (
            not normal
            or normal in (".", "..")
            or normal.startswith(("/", "../"))
            or os.path.isabs(relative)
        ):
            raise PipelineError(
                "input.invalid", f"artifact path {relative!r} escapes {self.step_dir(key)}"
            )
        path = self.step_dir(key) / normal
        self._refuse_links_to(key, normal)
        return path

    def has_force_marker(self, key: StepKey) -> bool:
        self.refuse_links(key)
        return self._lstat_ours(self.step_dir(key) / FORCE_MARKER, "a force marker") is not None

    # ------------------------------------------------------------------ no links
    def _lstat_ours(self, path: str | Path, what: str) -> os.stat_result | None:
        """lstat of a path of ours: None when absent, ``checkpoint.symlink`` when a link."""
        try:
            found = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat_module.S_ISLNK(found.st_mode):
            raise symlink_error(path, what)
        return found

    @contextlib.contextmanager
    def judging_scope(self) -> Iterator[None]:
        """Read-only judging of many keys (a sensor evaluation, ``decide``): the ancestors of
        their step directories are lstat'ed once per scope instead of once per step.

        Measured (benchmarks/sensor_tick.py, 2,000 episodes x 10 steps, cold tick): the
        per-step ancestor checks cost ~0.45 s of ~1.4 s. The trade is the judge's own for
        input identities (``BatchJudge._shared``): a link planted in an ancestor during a
        scope is seen by the next scope. Writers never run in one: they check every time.
        """
        previous = getattr(self._local, "scope", None)
        self._local.scope = set()
        try:
            yield
        finally:
            self._local.scope = previous

    def _walk_dirs(self, dirs: Sequence[str]) -> os.stat_result | None:
        """lstat each directory, top down; the deepest one's stat, or None when one is absent
        or not a directory (nothing below it exists to be followed; readers report it).

        Written for speed: the judge calls it for every step of every episode.
        """
        lstat, is_dir = os.lstat, stat_module.S_ISDIR
        scope: set[str] | None = getattr(self._local, "scope", None)
        last = len(dirs) - 1
        found: os.stat_result | None = None
        for index, directory in enumerate(dirs):
            if scope is not None and index < last and directory in scope:
                continue  # an ancestor already checked in this judging scope
            try:
                found = lstat(directory)
            except (FileNotFoundError, NotADirectoryError):
                return None
            if not is_dir(found.st_mode):  # one test in the common case: a real directory
                if stat_module.S_ISLNK(found.st_mode):
                    raise symlink_error(directory, "a directory")
                return None
            if scope is not None and index < last:
                scope.add(directory)
        return found

    def _refuse_linked_entries(self, directory: str, found: os.stat_result) -> None:
        """No entry of ``directory`` is a link; rescanned only when its identity moved.

        Adding, removing, renaming or replacing an entry moves the directory's mtime, so an
        unchanged ``(mtime_ns, inode)`` means unchanged entries. A directory changed within
        the filesystem's timestamp tick is not remembered (same rule as seals).
        """
        identity = dir_stat_identity(found)
        if self._clean_dirs.get(directory) == identity:
            return
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_symlink():
                        raise symlink_error(entry.path)
        except (FileNotFoundError, NotADirectoryError):
            return  # gone meanwhile: nothing in it to follow
        if not is_racy((found.st_mtime_ns, 0, 0), time.time_ns()):
            if len(self._clean_dirs) >= MAX_CLEAN_DIRS:
                self._clean_dirs.clear()
            self._clean_dirs[directory] = identity

    def refuse_links(self, key: StepKey) -> bool:
        """Raise ``checkpoint.symlink`` if a directory from the home down to ``key``'s step
        directory, or any entry directly in the step directory, is a symlink.

        True when the step directory exists. This is what every judgement of ``key`` pays:
        four ``lstat`` calls, plus a scan of the step directory when it changed.
        """
        chain = self._chain_of(key)
        found = self._walk_dirs(chain)
        if found is None:
            return False
        step = chain[-1]
        if self._clean_dirs.get(step) != dir_stat_identity(found):
            self._refuse_linked_entries(step, found)
        return True

    def _refuse_links_to(self, key: StepKey, relative: str) -> None:
        """Like :meth:`refuse_links`, plus every directory on the way to ``relative`` (a
        normalized path inside the step directory), the entries of its own directory, and the
        file itself."""
        if not self.refuse_links(key):
            return
        step = self._paths_of(key)[0]
        parts = relative.split("/")
        directory = str(step)
        for part in parts[:-1]:
            directory = f"{directory}/{part}"
            found = self._lstat_ours(directory, "a directory")
            if found is None or not stat_module.S_ISDIR(found.st_mode):
                return
            self._refuse_linked_entries(directory, found)
        self._lstat_ours(step / relative, "a file")

    def refuse_links_in_tree(self, key: StepKey) -> None:
        """No link anywhere in ``key``'s step directory (archive and pending included).

        What every operation that writes, archives or deletes there checks first: its cost
        (a walk of the step's few files) is nothing next to a publish, and a link found half
        way through would leave a half-done operation.
        """
        if not self.refuse_links(key):
            return
        pending = [self._chain_of(key)[-1]]
        while pending:
            directory = pending.pop()
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        if entry.is_symlink():
                            raise symlink_error(entry.path)
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(entry.path)
            except (FileNotFoundError, NotADirectoryError):
                continue

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
        self.refuse_links(key)
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
            path = self.artifact_path(checkpoint.key, artifact.path)
            if not path.is_file():
                missing.append(f"{artifact.path} (missing)")
            elif path.stat().st_size != artifact.bytes or file_sha256(path) != artifact.sha256:
                changed.append(f"{artifact.path} (sha256 mismatch)")
        return missing, changed

    # ------------------------------------------------------------------ writing
    def write_artifact(self, key: StepKey, relative: str, payload: bytes) -> Artifact:
        path = self.artifact_path(key, relative)  # refuses a link on the way or in place
        atomic_write_bytes(path, payload)
        return Artifact(
            path=relative, sha256=hashlib.sha256(payload).hexdigest(), bytes=len(payload)
        )

    def archive_artifact(self, key: StepKey, relative: str) -> Path | None:
        """Move a present artifact aside into ``archive/`` (named by its sha256 prefix) before
        it is redrawn: nothing is lost. None when there is nothing to move."""
        path = self.artifact_path(key, relative)
        if not path.is_file():
            return None
        folder = self._archive_folder(key)
        target = folder / f"{file_sha256(path)[:16]}-{path.name}"
        self._lstat_ours(target, "an archived file")
        os.replace(path, target)
        return target

    def stage(self, checkpoint: Checkpoint) -> StagedCheckpoint:
        """Write the envelope to a temp file beside its target (fsynced, not yet visible).

        Any failure before the staged checkpoint is returned (a full disk, a link found by
        the archive) removes the temp file: only a returned stage leaves one, for
        :meth:`StagedCheckpoint.commit` or :meth:`StagedCheckpoint.discard`.
        """
        key = checkpoint.key
        target = self.path_for(key)
        self.refuse_links_in_tree(key)  # before anything is written there
        target.parent.mkdir(parents=True, exist_ok=True)
        self.refuse_links(key)  # mkdir may have made the chain: a link raced in meanwhile?
        fd, temp = tempfile.mkstemp(prefix=".checkpoint.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(checkpoint.to_json().encode("utf-8"))
                handle.flush()
                # mtime one second in the past: any later in-place write moves it, so the
                # file's identity can seal it at once (see resources.checkpoints.seal).
                past = time.time_ns() - BACKDATE_NS
                os.utime(handle.fileno(), ns=(past, past))
                os.fsync(handle.fileno())
            current = self._lstat_ours(target, "a checkpoint file")
            if current is not None and stat_module.S_ISREG(current.st_mode):
                # even an unreadable one: it is evidence, never destroyed
                self.archive(key, "replaced")
        except BaseException as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            named = _naming(exc, target)
            if named is not None:
                raise named from exc
            raise

        def after_commit() -> None:
            marker = target.parent / FORCE_MARKER
            with contextlib.suppress(FileNotFoundError):
                # A link planted after the check stays in place: the next load blocks on it.
                if not stat_module.S_ISLNK(os.lstat(marker).st_mode):
                    marker.unlink()
            with self._cache_lock:
                self._cache.pop(target, None)

        return StagedCheckpoint(Path(temp), target, after_commit)

    # ------------------------------------------------------------------ pending mutations
    def pending_path(self, mutator: StepKey, victim: str) -> Path:
        return self.step_dir(mutator) / PENDING_DIR / f"{victim}.json"

    def _refuse_pending_links(self, mutator: StepKey, victim: str) -> Path:
        path = self.pending_path(mutator, victim)
        self._refuse_links_to(mutator, f"{PENDING_DIR}/{path.name}")
        return path

    def write_pending(self, mutator: StepKey, edited: Checkpoint) -> Path:
        """Write ahead an edited victim envelope (durable before the mutator publishes)."""
        path = self._refuse_pending_links(mutator, edited.step_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, edited.to_json().encode("utf-8"))
        return path

    def load_pending(self, mutator: StepKey, victim: str) -> Checkpoint | None:
        """The written-ahead edit of ``victim``; None if absent or unreadable (never trusted
        beyond its content hash, which the caller compares with the published intent).

        A link in its place is no "absent": it raises ``checkpoint.symlink``.
        """
        path = self._refuse_pending_links(mutator, victim)
        try:
            raw = json.loads(read_nofollow(path))
            return Checkpoint.from_dict(raw, source=str(path))
        except PipelineError as exc:
            if exc.code == SYMLINK_CODE:
                raise
            return None
        except (OSError, ValueError):
            return None

    def drop_pending(self, mutator: StepKey, victim: str) -> None:
        path = self._refuse_pending_links(mutator, victim)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()

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
            for relative in _artifact_dirs(seal.artifacts) if seal.artifacts else ():
                found = self._lstat_ours(f"{step}/{relative}", "a directory")
                if found is None or not stat_module.S_ISDIR(found.st_mode):
                    return None
        except (PipelineError, FileNotFoundError, NotADirectoryError):
            return None
        # String paths (no pathlib): this runs for every step of every episode on a cold tick.
        return seal if seal.holds(self._home, f"{step}/{CHECKPOINT_FILE}", shared) else None

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
                fence(staged)
        finally:
            staged.discard()
        return True

    # ------------------------------------------------------------------ archives and force
    def _archive_folder(self, key: StepKey) -> Path:
        """``archive/`` of the step, created if absent; a link there (or in it) is refused."""
        folder = self.step_dir(key) / ARCHIVE_DIR
        found = self._lstat_ours(folder, "an archive directory")
        if found is None:
            folder.mkdir(parents=True, exist_ok=True)
            found = self._lstat_ours(folder, "an archive directory")
        if found is not None:
            self._refuse_linked_entries(str(folder), found)
        return folder

    def archive(self, key: StepKey, reason: str) -> Path | None:
        """Copy the current checkpoint into ``archive/``; keep the newest ``keep_archives``."""
        self.refuse_links(key)
        source = self.path_for(key)
        found = self._lstat_ours(source, "a checkpoint file")
        if found is None or not stat_module.S_ISREG(found.st_mode):
            return None
        folder = self._archive_folder(key)
        stamp = format_timestamp(datetime.now(UTC)).replace(":", "").replace(".", "-")
        target = folder / f"{stamp}-{reason}.json"
        self._lstat_ours(target, "an archived checkpoint")
        atomic_write_bytes(target, read_nofollow(source))
        # Prune regular files only, after checking them all: a link among them (found
        # fresh, not from the memo) stops the pruning before anything is deleted.
        with os.scandir(folder) as entries:
            listed = sorted(entries, key=lambda entry: entry.name)
        for entry in listed:
            if entry.is_symlink():
                raise symlink_error(entry.path, "an archived checkpoint")
        archives = [e for e in listed if e.name.endswith(".json") and e.is_file()]
        for old in archives[: max(0, len(archives) - self.keep_archives)]:
            os.unlink(old.path)
        return target

    def force_clear(self, key: StepKey) -> Path | None:
        """Archive the checkpoint, take it out of service and leave a ``.force_cleared`` marker.

        Every link in the step directory is refused before anything is archived, written or
        deleted: a force must not stop half way, nor act through a link.
        """
        self.refuse_links_in_tree(key)
        archived = self.archive(key, "force")
        step_dir = self.step_dir(key)
        step_dir.mkdir(parents=True, exist_ok=True)
        marker = step_dir / FORCE_MARKER
        self._lstat_ours(marker, "a force marker")
        atomic_write_bytes(marker, (archived.name if archived else "").encode())
        path = self.path_for(key)
        if archived is not None and archived.is_file():
            self._lstat_ours(path, "a checkpoint file")
            path.unlink(missing_ok=True)  # its bytes are in the archive
        with self._cache_lock:
            self._cache.pop(path, None)
        return archived

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
                    if step.is_symlink() or os.path.lexists(f"{step.path}/{CHECKPOINT_FILE}"):
                        yield StepKey(project.name, episode.name, step.name)
