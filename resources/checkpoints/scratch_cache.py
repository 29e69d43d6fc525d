"""Published checkpoints, the scratch cache: a process's copy of what the storage holds.

- **Read** (:meth:`ScratchCache.load`): the row's pointer names the manifest; the
  scratch copy of the step is brought to it (the envelope and each artifact fetched and
  verified against the manifest's sha256 and size) before the usual load and verification.
  A copy is kept, with no download, only while the storage still holds the very objects
  the manifest names (size and e_tag/version, one LIST of the step's prefix): bytes that
  match in scratch say nothing of an object replaced behind the ledger's back. A marker
  per step directory names the pointer the copy holds; within one judging scope a step
  compared once is not listed again.
- **Publish** (:meth:`ScratchCache.stage`): the envelope is staged in scratch as on
  disk, then every artifact it lists is put create-only under an attempt prefix of the
  publication's own (:meth:`BucketCheckpoints.publication`: never one an earlier
  publication wrote, whatever its content), or named from the previous manifest when its
  bytes are unchanged, the envelope last; the staged checkpoint carries the manifest as
  its ``pointer``.

The whole protocol is told in :mod:`resources.checkpoints.published`.
"""

import atexit
import contextlib
import json
import os
import shutil
import stat as stat_module
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import ErrorCode, IntegrityViolation, PipelineError
from pipeline_defs.resume.files import file_sha256, read_nofollow
from pipeline_defs.resume.identity import FileIdentity
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.atomic import atomic_write_bytes
from resources.checkpoints.bucket import ENVELOPE_WHAT, BucketCheckpoints
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.manifest import Manifest, ObjectRef, decode_companions
from resources.checkpoints.object_seal import SealDrift
from resources.checkpoints.pointer_source import PointerSource, pointer_digest
from resources.checkpoints.published_inputs import PublishedInputs
from resources.checkpoints.published_pending import PublishedPending
from resources.checkpoints.published_seals import PublishedSeals
from resources.checkpoints.seal import Seal, identity_of
from resources.checkpoints.staging import StagedCheckpoint
from resources.checkpoints.tree import CheckpointTree
from resources.storage import ObjectMeta, Storage

UNSCANNED = "unscanned"  # under a scratch: never created, so the tick's stats never move


def companion_files(tree: CheckpointTree, checkpoint: Checkpoint) -> dict[str, bytes]:
    """The files beside a checkpoint's artifacts in ``tree``'s step directory named after
    one (``C01.png`` -> ``C01.png.receipt.json``), by relative path: published with it in one
    object (``Manifest.companions``), so a re-run that lost the envelope reuses a picture its
    receipt vouches for, as a local home does (:meth:`ScratchCache.recall`)."""
    key = checkpoint.key
    artifacts = [a.path for a in checkpoint.artifacts]
    named = set(artifacts)
    out: dict[str, bytes] = {}
    for relative in tree.with_companions(key, artifacts):
        if relative in named:
            continue
        with contextlib.suppress(OSError):  # only regular files: never a link, never a folder
            if stat_module.S_ISREG(os.lstat(tree.paths.step_dir(key) / relative).st_mode):
                out[relative] = read_nofollow(tree.links.artifact_path(key, relative))
    return out


class ScratchCache:
    """Publication in object storage, with the home's tree as this process's scratch cache:
    reads bring the scratch copy to the published pointer, stages upload the attempt.

    Composed of the inputs (:class:`~resources.checkpoints.published_inputs.PublishedInputs`),
    the seals and the scrub (:class:`~resources.checkpoints.published_seals.PublishedSeals`)
    and the write-ahead edits (:class:`~resources.checkpoints.published_pending.
    PublishedPending`); the copies, reads and publication are here.
    """

    scrubbable = True

    def __init__(
        self, tree: CheckpointTree, storage: Storage, pointers: PointerSource, scratch: Path
    ) -> None:
        # ``scratch`` is a tree of this process's own: a run's drawn pictures and the copies
        # the sensor brings up to date never meet, and each run verifies what it reads in
        # full (it fetches it). Removed when the process exits; any left behind (a kill) is
        # only a cache.
        self.tree = tree
        self.scratch = scratch
        self.bucket = BucketCheckpoints(storage)
        self.pointers = pointers
        self._scan_layout = DataLayout.of(tree.paths.home, scratch / UNSCANNED)
        # Steps a scrub found drifted: their seal is not trusted and their copy is fetched
        # again (not taken from the marker) the next time they are loaded.
        self.drifted: set[StepKey] = set()
        self.inputs = PublishedInputs(tree.paths.home, self.bucket)
        self.seals = PublishedSeals(
            tree.paths, self.inputs, self.bucket, pointers, self.drifted, self.decode
        )
        self.pending = PublishedPending(self.bucket)
        # Steps whose row is lost -> the pointer of the attempt ``load`` found for them.
        self._orphans: dict[StepKey, str] = {}
        # Within a judging scope: the (step, pointer digest) whose objects this process
        # compared with the storage already (one LIST per step and scope, not per load).
        self._scope_held = threading.local()
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)

    @property
    def storage(self) -> Storage:
        """The storage checkpoints are published in (the bucket's)."""
        return self.bucket.storage

    @property
    def shared(self) -> Storage:
        """What every machine shares: the bucket (the journal of paid replies lives there)."""
        return self.bucket.storage

    poolable = False  # worker processes would judge from a local tree that is not the truth

    @property
    def scan_layout(self) -> DataLayout:
        """The tick scans no checkpoint tree here: the scratch copy changes whenever this
        process fetches (a judgement the long way, a run), which is no change of the
        partition, and a run key built from it would differ from tick to tick. A change of
        a published checkpoint moves its ledger row; drift is the scrub's. The inputs'
        copies stay watched: the project config is copied in before each tick."""
        return self._scan_layout

    @property
    def location(self) -> str:
        """Where checkpoints are published (secrets masked), for messages."""
        return self.storage.url

    # ------------------------------------------------------------------ inputs and seals
    def sync_inputs(self, project_id: str, episode_id: str | None = None) -> None:
        self.inputs.sync_inputs(project_id, episode_id)

    def publish_inputs(self, project_id: str, episode_id: str) -> bool:
        return self.inputs.publish_inputs(project_id, episode_id)

    def seal(
        self,
        checkpoint: Checkpoint,
        reads: Iterable[Path] = (),
        *,
        file: Path | None = None,
        revision: int = 1,
    ) -> str | None:
        return self.seals.seal(checkpoint, reads, revision=revision)

    def sealed(
        self,
        key: StepKey,
        text: Any,
        shared: Callable[[str], FileIdentity | None] = identity_of,
    ) -> Seal | None:
        return self.seals.sealed(key, text)

    def scrub(
        self, project_id: str, episode_id: str, rows: Mapping[str, tuple[str | None, str | None]]
    ) -> list[SealDrift]:
        return self.seals.scrub(project_id, episode_id, rows)

    def object_url(self, key: str) -> str:
        """Where an object of the storage is, as an operator names it (secrets masked)."""
        return f"{self.storage.url}/{key}"

    def episode_manifests(self, project_id: str, episode_id: str) -> dict[str, Manifest]:
        """Step id -> the published manifest of every row of one episode (one ledger read)."""
        out: dict[str, Manifest] = {}
        for step_id, text in self.pointers.episode_pointers(project_id, episode_id).items():
            if text is not None:
                out[step_id] = self.decode(StepKey(project_id, episode_id, step_id), text)
        return out

    # ------------------------------------------------------------------ reads
    def manifest(self, key: StepKey) -> Manifest | None:
        """The published manifest of ``key`` (None: nothing published)."""
        text = self.pointers.pointer(key)
        return None if text is None else self.decode(key, text)

    def decode(self, key: StepKey, text: str) -> Manifest:
        """The manifest a ledger row's pointer ``text`` names, which must be ``key``'s."""
        manifest = Manifest.decode(text, where=f"the ledger row of {key}")
        if manifest.step != key:
            raise PipelineError(
                ErrorCode.IO_INTEGRITY_VIOLATION,
                f"the ledger row of {key} points at a checkpoint of {manifest.step}",
                origin=Origin.CONTRACT_DRIFT.value,
            )
        return manifest

    def load(self, key: StepKey) -> Checkpoint | None:
        self._orphans.pop(key, None)
        has_row, text = self.pointers.row_pointer(key)
        if text is None:
            if has_row:
                return None  # a row without a pointer (a force, a reset): nothing published
            text = self._orphan(key)
            if text is None:
                return None
        return self.load_published(key, text, self.decode(key, text))

    def _orphan(self, key: StepKey) -> str | None:
        """With no row at all for ``key`` (the ledger lost it), the pointer of the newest
        complete attempt the storage holds (:meth:`BucketCheckpoints.discover`), kept for
        the adopting row (:meth:`adoptable_pointer`): what a local home's orphan checkpoint
        file is."""
        manifest = self.bucket.discover(key)
        if manifest is None:
            return None
        text = manifest.encode()
        self._orphans[key] = text
        return text

    def adoptable_pointer(self, key: StepKey) -> str | None:
        return self._orphans.get(key)

    def load_published(self, key: StepKey, text: str, manifest: Manifest) -> Checkpoint | None:
        """``load`` of the pointer ``text`` already read (decoded as ``manifest``)."""
        if not self._hydrate(key, text, manifest):
            return None  # the envelope object is gone: completed without checkpoint
        return self.tree.envelopes.load(key)

    @contextlib.contextmanager
    def judging_scope(self) -> Iterator[None]:
        """The tree's scope (ancestors lstat'ed once), the episodes' pointers read once
        (the seals), and each step's objects compared with the storage once."""
        previous = getattr(self._scope_held, "seen", None)
        self._scope_held.seen = set()
        try:
            with self.tree.links.judging_scope(), self.seals.judging_scope():
                yield
        finally:
            self._scope_held.seen = previous

    def _hydrate(self, key: StepKey, text: str, manifest: Manifest) -> bool:
        """Bring the scratch copy of ``key`` to ``manifest``; False if its envelope is gone.

        The copy marked as this pointer's is kept only while the storage holds the objects
        the manifest names (one LIST): a long-lived process (the sensor's code server)
        sees an object replaced or deleted behind its back as a fresh machine does, as
        soon as it judges the step the long way (its seal cleared by a scrub, here or
        anywhere), instead of trusting bytes it verified earlier."""
        self.tree.links.refuse_links_in_tree(key)
        marker = self._published_marker(key)
        digest = pointer_digest(text)
        drifted = key in self.drifted  # a scrub saw the storage differ: fetch, do not trust
        held = _Held(self.bucket, manifest)
        seen: set[tuple[StepKey, str]] | None = getattr(self._scope_held, "seen", None)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            if (
                not drifted
                and read_nofollow(marker).decode("utf-8") == digest
                and self.tree.paths.path_for(key).is_file()
                and ((key, digest) in (seen or ()) or held.all_published())
            ):
                if seen is not None:
                    seen.add((key, digest))
                return True
        self._fetch_artifacts(key, manifest, held)
        envelope = self.bucket.fetch(manifest.envelope, what=ENVELOPE_WHAT)
        self.drifted.discard(key)  # judged from what the storage holds now
        if envelope is None:
            return False
        atomic_write_bytes(self.tree.paths.path_for(key), envelope)
        atomic_write_bytes(marker, digest.encode("utf-8"))
        return True

    def _published_marker(self, key: StepKey) -> Path:
        """The marker naming the pointer ``key``'s scratch copy holds."""
        return Path(
            self.tree.paths.layout.published_marker(key.project_id, key.episode_id, key.step_id)
        )

    def recall(self, key: StepKey) -> Checkpoint | None:
        """What ``key`` last published, for a re-run that has no checkpoint to start from:
        the artifacts its manifest names that still verify, and the files named after them
        (their receipts), brought into this process's copy of the step directory, where a
        run looks for them; the envelope when it is still readable.

        On a local home a lost envelope or a force leaves every picture beside its
        receipt, so a re-run reuses them; here a new process's scratch starts empty and
        would pay for every one again (a force of the review redrew every picture, a lost
        envelope redrew the whole step). The manifest comes from the row (its envelope is
        gone: ``load`` found nothing) or, after a force, from the archive. An artifact whose
        object is gone or no longer the published bytes is left out (the run draws it).
        Nothing is written to the checkpoint file: only artifacts are offered."""
        self._gather_leftovers(key)
        current = self.pointers.pointer(key)
        texts = [current] if current is not None else list(self.pointers.archived_pointers(key))
        if not texts:
            return None
        try:
            manifest = self.decode(key, texts[0])
        except PipelineError:
            return None  # nothing to reuse: the run draws what it needs
        self.tree.links.refuse_links_in_tree(key)
        held = _Held(self.bucket, manifest)
        for relative, ref in sorted(manifest.artifacts.items()):
            try:
                self._fetch(key, relative, ref, held)
            except IntegrityViolation:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(
                        self.tree.links.artifact_path(key, relative)
                    )  # not the published bytes
        if manifest.companions is not None:
            with contextlib.suppress(PipelineError):  # a cache: unreadable, nothing reused
                bundle = self.bucket.fetch(manifest.companions, what="companions")
                for relative, data in decode_companions(bundle or b"").items():
                    # Only a file named after an artifact: never an artifact itself.
                    if any(relative.startswith(f"{a}.") for a in manifest.artifacts):
                        atomic_write_bytes(self.tree.links.artifact_path(key, relative), data)
        try:
            envelope = self.bucket.fetch(manifest.envelope, what=ENVELOPE_WHAT)
            if envelope is None:
                return None
            where = f"{self.location}/{manifest.envelope.key}"
            return Checkpoint.from_dict(json.loads(envelope), source=where)
        except (PipelineError, ValueError):
            return None

    def _gather_leftovers(self, key: StepKey) -> None:
        """What another process of this home drew for ``key`` and never published (it was
        killed: its scratch outlives it) brought into this process's copy of the step: each
        file that has files named after it (a picture and its receipt), as a local home
        keeps them in the step directory. Only copies: a run reuses a picture only when its
        receipt vouches for its bytes and its prompt."""
        ours = self.tree.paths.step_dir(key)
        below = ours.relative_to(self.scratch)
        try:
            siblings = [
                entry.path
                for entry in os.scandir(self.scratch.parent)
                if entry.is_dir(follow_symlinks=False) and entry.path != str(self.scratch)
            ]
        except FileNotFoundError:
            return
        for sibling in sorted(siblings):
            theirs = Path(sibling) / below
            for folder, dirs, files in os.walk(theirs):  # links are not followed
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                here = Path(folder).relative_to(theirs)
                for name in files:
                    if not any(f.startswith(f"{name}.") for f in files):
                        continue  # only what comes with its companions
                    for part in [name, *(f for f in files if f.startswith(f"{name}."))]:
                        target = ours / here / part
                        if target.exists():
                            continue
                        with contextlib.suppress(OSError):
                            atomic_write_bytes(target, read_nofollow(Path(folder) / part))

    def checkout_edit(self, key: StepKey) -> None:
        """Bring the copy of ``key`` to its pointer with the envelope as the storage holds
        it now: an operator's edit of the envelope object (downloaded, edited, put back),
        unverified, for ``storyboard accept`` to validate. The copy is not marked as the
        published one: any other read fetches and verifies again."""
        text = self.pointers.pointer(key)
        if text is None:
            return  # nothing published: the accept says so
        manifest = self.decode(key, text)
        self.tree.links.refuse_links_in_tree(key)
        self._fetch_artifacts(key, manifest, _Held(self.bucket, manifest))
        payload = self.bucket.fetch_unverified(manifest.envelope.key)
        if payload is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tree.paths.path_for(key))
            return
        atomic_write_bytes(self.tree.paths.path_for(key), payload)

    def _fetch_artifacts(self, key: StepKey, manifest: Manifest, held: "_Held") -> None:
        """The copy's artifacts brought to ``manifest``, its marker dropped first: a copy half
        brought up to date is never taken as the published one."""
        with contextlib.suppress(FileNotFoundError):
            self._published_marker(key).unlink()
        for relative, ref in sorted(manifest.artifacts.items()):
            self._fetch(key, relative, ref, held)

    def _fetch(self, key: StepKey, relative: str, ref: ObjectRef, held: "_Held") -> None:
        """One artifact into scratch: kept when its bytes are the published ones *and* the
        storage still holds the published object (size, e_tag/version); fetched and
        verified otherwise (an object replaced behind the ledger's back is then
        ``io.integrity_violation``, as on a fresh machine), absent (moved out of the way)
        when the object is gone."""
        path = self.tree.links.artifact_path(key, relative)
        here = path.is_file() and path.stat().st_size == ref.size
        if here and file_sha256(path) == ref.sha256 and held.published(ref):
            return  # the published bytes are here already: no download
        payload = self.bucket.fetch(ref, what=f"artifact {relative}")
        if payload is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # scratch: the truth (a missing object) must show here
            return
        atomic_write_bytes(path, payload)

    # ------------------------------------------------------------------ publish
    def stage(self, checkpoint: Checkpoint) -> StagedCheckpoint:
        """Stage in scratch, upload the attempt, and carry its manifest as the pointer."""
        staged = self.tree.publisher.stage(checkpoint)
        try:
            key = checkpoint.key
            previous = self.manifest(key)
            owner = str(checkpoint.produced_by.get("run_id") or "unowned")
            # One attempt per publication: never one an earlier publication wrote, even of
            # the same content (an accept back to the original words, a review's edit that
            # flips a field back): its envelope object is create-only.
            attempt = self.bucket.publication(key, owner)
            for artifact in checkpoint.artifacts:
                kept = previous.artifacts.get(artifact.path) if previous else None
                if kept is not None and self._still_there(kept, artifact.sha256, artifact.bytes):
                    attempt.reuse(artifact.path, kept)
                    continue
                data = read_nofollow(self.tree.links.artifact_path(key, artifact.path))
                attempt.put(artifact.path, data)
            attempt.put_companions(companion_files(self.tree, checkpoint))
            manifest = attempt.publishable(checkpoint)
        except BaseException:
            staged.discard()
            raise
        pointer = manifest.encode()
        marker = self._published_marker(checkpoint.key)
        inner = staged

        class _Published(StagedCheckpoint):
            def commit(self) -> None:
                with contextlib.suppress(FileNotFoundError):
                    marker.unlink()
                inner.commit()
                atomic_write_bytes(marker, pointer_digest(pointer).encode("utf-8"))
                self.committed = True

            def discard(self) -> None:
                inner.discard()

        return _Published(staged.temp, staged.target, lambda: None, pointer=pointer)

    def _still_there(self, ref: ObjectRef, sha256: str, size: int) -> bool:
        """The published object holds these bytes and is still in the storage (one HEAD)."""
        if (ref.sha256, ref.size) != (sha256, size):
            return False
        meta = self.storage.head(ref.key)
        return meta is not None and ref.same_object(meta.size, meta.e_tag, meta.version)

    def is_unchanged(self, checkpoint: Checkpoint) -> bool:
        """Same content as published, and every object it names still the published one in
        the storage (one LIST, one GET of the envelope): a re-run that redrew a deleted
        picture has the same content but must publish it. The scratch copy is not
        touched: it holds the run's own work, which a fetch would overwrite (a redrawn
        picture whose object is gone would be removed before its upload)."""
        key = checkpoint.key
        text = self.pointers.pointer(key)
        if text is None:
            return False
        try:
            published = self.decode(key, text)
            if not _Held(self.bucket, published).all_published():
                return False
            current = self.bucket.load(published)
        except PipelineError:
            return False
        return current is not None and current.identity_hash == checkpoint.identity_hash


class _Held:
    """What the storage holds under a manifest's keys, listed once when first asked."""

    def __init__(self, bucket: BucketCheckpoints, manifest: Manifest) -> None:
        self._bucket = bucket
        self._manifest = manifest
        self._found: dict[str, ObjectMeta | None] | None = None

    def published(self, ref: ObjectRef) -> bool:
        """The storage holds the object ``ref`` names (not another one under its key)."""
        if self._found is None:
            self._found = self._bucket.held(self._manifest)
        meta = self._found.get(ref.key)
        return meta is not None and ref.same_object(meta.size, meta.e_tag, meta.version)

    def all_published(self) -> bool:
        """Every object the manifest names is the published one."""
        refs = [self._manifest.envelope, *self._manifest.artifacts.values()]
        return all(self.published(ref) for ref in refs)
