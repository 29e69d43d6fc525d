"""Checkpoints published as objects (a bucket), worked on in a scratch copy.

With ``PIPELINE_STORAGE_URL`` set, the truth is the storage plus the ledger: each step's
published checkpoint is the manifest in its row (``step_run.checkpoint_pointer``), naming
immutable objects of one attempt (:mod:`resources.checkpoints.bucket`). ``PIPELINE_HOME``
is scratch: a worker, the sensor or the CLI keeps there a copy of what it read, so that
the steps, the verifiers and the run protocol keep working on plain files, exactly as on
one shared disk. The copy is a cache that any machine can lose; nothing is only there.

- **Read** (:meth:`PublishedCheckpoints.load`): the row's pointer names the manifest; the
  scratch copy of the step is brought to it (the envelope and each artifact fetched and
  verified against the manifest's sha256 and size, an artifact whose scratch bytes already
  match kept without a request) before the usual load and verification. An object deleted
  from the bucket is absent in scratch (``artifact_missing``: a self-only re-run);
  replaced bytes are ``io.integrity_violation`` naming the object (a block). A marker per
  step directory names the pointer the copy holds, so an unchanged pointer costs no
  request. No pointer: nothing is published (the scratch is not consulted).
- **Publish** (:meth:`PublishedCheckpoints.stage`): the envelope is staged in scratch as
  on disk, then every artifact it lists is put create-only under the claim's own attempt
  prefix (or named from the previous manifest when its bytes are unchanged: copy-free
  reuse), the envelope last; the staged checkpoint carries the manifest as its
  ``pointer``, which the ledger stores in the owner-aware transaction that commits it. A
  fenced worker only ever wrote into its own attempt, and its transaction matches no row.
- **Write-ahead edits** of a mutator live in the storage (``pending/…``): another machine
  settles them after a crash.

Adapters stay independent: the pointers come from a :class:`PointerSource` the caller
(``resources/pipeline.py``) builds over the ledger.
"""

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol
from uuid import uuid4

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.files import file_sha256, read_nofollow, write_file_under
from pipeline_defs.resume.identity import FileIdentity
from pipeline_defs.resume.layout import PUBLISHED_MARKER as PUBLISHED_MARKER
from pipeline_defs.resume.layout import SCRATCH_DIR as SCRATCH_DIR
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.bucket import ENVELOPE_WHAT, BucketCheckpoints
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.manifest import Manifest, ObjectRef
from resources.checkpoints.object_seal import ObjectSeal, SealDrift
from resources.checkpoints.seal import Seal, identity_of
from resources.checkpoints.store import CheckpointStore, StagedCheckpoint, atomic_write_bytes
from resources.storage import ObjectMeta, Storage

# PUBLISHED_MARKER (DataLayout.published_marker) names the pointer a scratch step directory
# holds a verified copy of (sha256 of its text); SCRATCH_DIR (DataLayout.scratch_dir) holds
# the per-process copies, never the truth. Both re-exported above for their callers.
# How long a process trusts its copy of an episode's inputs before asking the storage again.
INPUTS_MAX_AGE_SECONDS = 5.0
UNSCANNED = "unscanned"  # under a scratch: never created, so the tick's stats never move


class PointerSource(Protocol):
    """The published pointer of a step: its ledger row's ``checkpoint_pointer``."""

    def pointer(self, key: StepKey) -> str | None: ...

    def episode_pointers(self, project_id: str, episode_id: str) -> Mapping[str, str | None]:
        """Step id -> pointer of every row of one episode (one read)."""
        ...


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class PublishedCheckpoints(CheckpointStore):
    """The checkpoint store over object storage, with ``home`` as scratch."""

    def __init__(
        self,
        home: Path,
        storage: Storage,
        pointers: PointerSource,
        *,
        keep_archives: int = 5,
    ) -> None:
        # A scratch tree of this process's own: a run's drawn pictures and the copies the
        # sensor brings up to date never meet, and each run verifies what it reads in full
        # (it fetches it). Removed when the process exits; any left behind (a kill) is
        # only a cache.
        process = f"{socket.gethostname()}-{os.getpid()}-{uuid4().hex[:8]}"
        home_layout = DataLayout.of(home)
        scratch = Path(home_layout.process_scratch(process))
        super().__init__(
            home,
            keep_archives=keep_archives,
            checkpoints_root=home_layout.scratch_checkpoints(process),
        )
        self.scratch = scratch
        self._home_prefix = f"{self.layout.home}/"
        self._scan_layout = DataLayout.of(home, scratch / UNSCANNED)
        self.storage = storage
        self.bucket = BucketCheckpoints(storage)
        self.pointers = pointers
        # (project, episode) -> when its inputs were last synced; input key -> the e_tag of
        # the local copy.
        self._synced: dict[tuple[str, str | None], float] = {}
        self._input_tags: dict[str, str | None] = {}
        # What this process last saw in the storage (a sync or a scrub): input key -> e_tag,
        # and the keys of each episode's input folder. Seals are checked against these.
        self._seen_inputs: dict[str, str | None] = {}
        self._seen_folders: dict[str, frozenset[str]] = {}
        # Steps a scrub found drifted: their seal is not trusted and their copy is fetched
        # again (not taken from the marker) the next time they are loaded.
        self._drifted: set[StepKey] = set()
        self._scope_pointers = threading.local()
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)

    @property
    def poolable(self) -> bool:
        return False  # worker processes would judge from a local tree that is not the truth

    @property
    def scrubbable(self) -> bool:
        return True

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

    # ------------------------------------------------------------------ reads
    def manifest(self, key: StepKey) -> Manifest | None:
        """The published manifest of ``key`` (None: nothing published)."""
        text = self.pointers.pointer(key)
        return None if text is None else self._decode(key, text)

    def _decode(self, key: StepKey, text: str) -> Manifest:
        manifest = Manifest.decode(text, where=f"the ledger row of {key}")
        if manifest.step != key:
            raise PipelineError(
                ErrorCode.IO_INTEGRITY_VIOLATION,
                f"the ledger row of {key} points at a checkpoint of {manifest.step}",
                origin=Origin.CONTRACT_DRIFT.value,
            )
        return manifest

    def load(self, key: StepKey) -> Checkpoint | None:
        text = self.pointers.pointer(key)
        if text is None:
            return None
        return self.load_published(key, text, self._decode(key, text))

    def load_published(self, key: StepKey, text: str, manifest: Manifest) -> Checkpoint | None:
        """``load`` of the pointer ``text`` already read (decoded as ``manifest``)."""
        if not self._hydrate(key, text, manifest):
            return None  # the envelope object is gone: completed without checkpoint
        return super().load(key)

    def _hydrate(self, key: StepKey, text: str, manifest: Manifest) -> bool:
        """Bring the scratch copy of ``key`` to ``manifest``; False if its envelope is gone."""
        self.refuse_links_in_tree(key)
        marker = self._published_marker(key)
        digest = _digest(text)
        drifted = key in self._drifted  # a scrub saw the storage differ: fetch, do not trust
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            if (
                not drifted
                and read_nofollow(marker).decode("utf-8") == digest
                and self.path_for(key).is_file()
            ):
                return True
        self._fetch_artifacts(key, manifest)
        envelope = self.bucket.fetch(manifest.envelope, what=ENVELOPE_WHAT)
        self._drifted.discard(key)  # judged from what the storage holds now
        if envelope is None:
            return False
        atomic_write_bytes(self.path_for(key), envelope)
        atomic_write_bytes(marker, digest.encode("utf-8"))
        return True

    def _published_marker(self, key: StepKey) -> Path:
        """The marker naming the pointer ``key``'s scratch copy holds."""
        return Path(self.layout.published_marker(key.project_id, key.episode_id, key.step_id))

    def checkout_edit(self, key: StepKey) -> None:
        """Bring the copy of ``key`` to its pointer with the envelope as the storage holds
        it now: an operator's edit of the envelope object (downloaded, edited, put back),
        unverified, for ``storyboard accept`` to validate. The copy is not marked as the
        published one: any other read fetches and verifies again."""
        text = self.pointers.pointer(key)
        if text is None:
            return  # nothing published: the accept says so
        manifest = self._decode(key, text)
        self.refuse_links_in_tree(key)
        self._fetch_artifacts(key, manifest)
        payload = self.bucket.fetch_unverified(manifest.envelope.key)
        if payload is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path_for(key))
            return
        atomic_write_bytes(self.path_for(key), payload)

    def _fetch_artifacts(self, key: StepKey, manifest: Manifest) -> None:
        """The copy's artifacts brought to ``manifest``, its marker dropped first: a copy half
        brought up to date is never taken as the published one."""
        with contextlib.suppress(FileNotFoundError):
            self._published_marker(key).unlink()
        for relative, ref in sorted(manifest.artifacts.items()):
            self._fetch(key, relative, ref)

    def _fetch(self, key: StepKey, relative: str, ref: ObjectRef) -> None:
        """One artifact into scratch: kept when its bytes are the published ones, fetched
        and verified otherwise, absent (moved out of the way) when the object is gone."""
        path = self.artifact_path(key, relative)
        held = path.is_file() and path.stat().st_size == ref.size
        if held and file_sha256(path) == ref.sha256 and self.storage.head(ref.key) is not None:
            return  # the published bytes are here already: one HEAD, no download
        payload = self.bucket.fetch(ref, what=f"artifact {relative}")
        if payload is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # scratch: the truth (a missing object) must show here
            return
        atomic_write_bytes(path, payload)

    # ------------------------------------------------------------------ publish
    def stage(self, checkpoint: Checkpoint) -> StagedCheckpoint:
        """Stage in scratch, upload the attempt, and carry its manifest as the pointer."""
        staged = super().stage(checkpoint)
        try:
            key = checkpoint.key
            previous = self.manifest(key)
            owner = str(checkpoint.produced_by.get("run_id") or "unowned")
            # One attempt per owner and content: a mutator's edit of a victim (same producer)
            # gets its own prefix, and a retried stage of the same content finds its objects.
            attempt = self.bucket.attempt(
                key, f"{owner}|{checkpoint.content_hash}", checkpoint.created_at
            )
            for artifact in checkpoint.artifacts:
                kept = previous.artifacts.get(artifact.path) if previous else None
                if kept is not None and self._still_there(kept, artifact.sha256, artifact.bytes):
                    attempt.reuse(artifact.path, kept)
                    continue
                data = read_nofollow(self.artifact_path(key, artifact.path))
                attempt.put(artifact.path, data)
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
                atomic_write_bytes(marker, _digest(pointer).encode("utf-8"))
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
        """Same content as published, and every object it names still in the storage: a
        re-run that redrew a deleted picture has the same content but must publish it."""
        key = checkpoint.key
        text = self.pointers.pointer(key)
        if text is None:
            return False
        try:
            published = self._decode(key, text)
            current = self.load_published(key, text, published)
        except PipelineError:
            return False
        if current is None:
            return False
        if current.identity_hash != checkpoint.identity_hash:
            return False
        return all(
            self._still_there(ref, ref.sha256, ref.size) for ref in published.artifacts.values()
        )

    # ------------------------------------------------------------------ seals
    def seal(
        self,
        checkpoint: Checkpoint,
        reads: Iterable[Path] = (),
        *,
        file: Path | None = None,
        revision: int = 1,
    ) -> str | None:
        """A seal any machine can check from the ledger (:mod:`~resources.checkpoints.
        object_seal`): the inputs the verifier read by the ``e_tag`` of the published
        object this process verified a copy of, the victims by their pointers. None (the
        step is judged the long way) when a read is not a published input or a victim."""
        inputs: dict[str, str] = {}
        victims: dict[str, str] = {}
        home = self.home.resolve()
        checkpoints = Path(self.layout.checkpoints).resolve()
        episode = checkpoint.key
        for path in reads:
            resolved = Path(path).resolve()
            if resolved.is_relative_to(checkpoints):
                parts = resolved.relative_to(checkpoints).parts
                if len(parts) < 3 or (parts[0], parts[1]) != (
                    episode.project_id,
                    episode.episode_id,
                ):
                    return None
                pointer = self.pointers.pointer(StepKey(parts[0], parts[1], parts[2]))
                if pointer is None:
                    return None
                victims[parts[2]] = _digest(pointer)
                continue
            if not resolved.is_relative_to(home):
                return None
            if resolved.is_dir():
                continue  # a folder is the set of its files, all named below
            tag = self._input_tags.get(resolved.relative_to(home).as_posix())
            if tag is None:
                return None  # an input only this home holds: nothing to compare with
            inputs[resolved.relative_to(home).as_posix()] = tag
        return ObjectSeal(
            summary=checkpoint.summary(),
            version=checkpoint.version,
            artifacts=tuple(a.path for a in checkpoint.artifacts),
            inputs=inputs,
            victims=victims,
            sealed_ns=time.time_ns(),
            revision=revision,
        ).encode()

    def sealed(
        self,
        key: StepKey,
        text: Any,
        shared: Callable[[str], FileIdentity | None] = identity_of,
    ) -> Seal | None:
        """The seal of ``key`` unless this process knows better: an input whose published
        ``e_tag`` (or folder) it saw differ, a victim whose pointer moved, or a drift its
        scrub found. No request: what the storage holds is the scrub's to compare."""
        seal = ObjectSeal.decode(text)
        if seal is None or key in self._drifted:
            return None
        for input_key, tag in seal.inputs.items():
            seen = self._seen_inputs.get(input_key, tag)
            if seen != tag:
                return None
        folder = self._inputs_folder(key.project_id, key.episode_id)
        listed = self._seen_folders.get(folder)
        if listed is not None and listed != _under(folder, seal.inputs):
            return None  # an input added or removed since the run verified them
        if seal.victims:
            pointers = self._episode_pointers(key.project_id, key.episode_id)
            for step_id, digest in seal.victims.items():
                pointer = pointers.get(step_id)
                if pointer is None or _digest(pointer) != digest:
                    return None
        return seal.as_seal()

    def _episode_pointers(self, project_id: str, episode_id: str) -> Mapping[str, str | None]:
        """One read per episode and judging scope (outside a scope: every time)."""
        cache: dict[tuple[str, str], Mapping[str, str | None]] | None = getattr(
            self._scope_pointers, "cache", None
        )
        if cache is not None and (project_id, episode_id) in cache:
            return cache[(project_id, episode_id)]
        found = self.pointers.episode_pointers(project_id, episode_id)
        if cache is not None:
            cache[(project_id, episode_id)] = found
        return found

    @contextlib.contextmanager
    def judging_scope(self) -> Iterator[None]:
        previous = getattr(self._scope_pointers, "cache", None)
        self._scope_pointers.cache = {}
        try:
            with super().judging_scope():
                yield
        finally:
            self._scope_pointers.cache = previous

    # ------------------------------------------------------------------ scrub
    def scrub(
        self, project_id: str, episode_id: str, rows: Mapping[str, tuple[str | None, str | None]]
    ) -> list[SealDrift]:
        """Compare the storage with one episode's sealed rows: one LIST of its checkpoint
        prefix and one of its input folder (whatever its number of steps and objects).

        ``rows``: step id -> (pointer, seal) of the episode's rows. Returns the seals that
        no longer speak for the storage: a published object deleted or replaced, an input
        changed, added or removed. Those steps are also judged the long way by this
        process (their copies fetched again); clearing the seals in the ledger, so that
        every process does, is the caller's.
        """
        folder = self._inputs_folder(project_id, episode_id)
        listed = {m.key: m.e_tag for m in self.storage.list(folder)}
        self._seen_inputs.update(listed)
        self._seen_folders[folder] = frozenset(listed)
        sealed: dict[str, tuple[Manifest, str, ObjectSeal]] = {}
        for step_id, (pointer, text) in rows.items():
            seal = ObjectSeal.decode(text)
            if pointer is None or seal is None:
                continue
            key = StepKey(project_id, episode_id, step_id)
            try:
                sealed[step_id] = (self._decode(key, pointer), str(text), seal)
            except PipelineError:
                continue  # a row naming a foreign checkpoint is judged (and blocked) anyway
        found: list[SealDrift] = []
        drifts = self.bucket.scrub_episode(
            project_id, episode_id, [manifest for manifest, _, _ in sealed.values()]
        )
        for drift in drifts:
            _, text, seal = sealed[drift.step.step_id]
            why = []
            if drift.missing:
                why.append(f"missing from the storage: {', '.join(drift.missing)}")
            if drift.changed:
                why.append(f"not the published objects: {', '.join(drift.changed)}")
            inputs = _under(folder, seal.inputs)
            if inputs != frozenset(listed):
                why.append("its inputs were added or removed")
            changed = sorted(k for k in inputs & set(listed) if listed[k] != seal.inputs[k])
            if changed:
                why.append(f"inputs changed: {', '.join(changed)}")
            if why:
                self._drifted.add(drift.step)
                found.append(SealDrift(drift.step, text, "; ".join(why)))
        if any(k in self._input_tags and self._input_tags[k] != t for k, t in listed.items()):
            self._synced.pop((project_id, episode_id), None)  # copy again on the next read
        return found

    # ------------------------------------------------------------------ inputs
    def _inputs_folder(self, project_id: str, episode_id: str) -> str:
        """The episode's input folder as a storage key (``sealed`` asks per step: no
        pathlib on the tick's path)."""
        return self.layout.episode_dir(project_id, episode_id).removeprefix(self._home_prefix)

    def _input_keys(self, project_id: str, episode_id: str | None) -> list[str]:
        keys = [self.layout.project_file(project_id)]
        if episode_id is not None:
            keys.append(self.layout.story_file(project_id, episode_id))
        return [str(Path(k).relative_to(self.home)) for k in keys]

    def sync_inputs(self, project_id: str, episode_id: str | None = None) -> None:
        """Copy the project's config and the episode's inputs from the storage into the
        home, where every reader finds them (at most once per ``INPUTS_MAX_AGE_SECONDS``
        per episode and process: a run starts with fresh inputs, a tick costs at most
        one LIST and one HEAD per episode it judges the long way).

        An input the storage does not hold keeps its local copy (a home whose inputs were
        never published). The home's copy is a cache here: it is overwritten by the
        published bytes, atomically and never through a link.
        """
        memo_key = (project_id, episode_id)
        now = time.monotonic()
        if now - self._synced.get(memo_key, -INPUTS_MAX_AGE_SECONDS) < INPUTS_MAX_AGE_SECONDS:
            return
        found: dict[str, ObjectMeta] = {}
        project_file = self._input_keys(project_id, None)[0]
        meta = self.storage.head(project_file)
        if meta is not None:
            found[project_file] = meta
        if episode_id is not None:
            folder = self._inputs_folder(project_id, episode_id)
            listed = {m.key: m for m in self.storage.list(folder)}
            self._seen_folders[folder] = frozenset(listed)
            found.update(listed)
        for key, meta in sorted(found.items()):
            self._seen_inputs[key] = meta.e_tag
            if self._input_tags.get(key) == meta.e_tag and (self.home / key).is_file():
                continue
            data = self.storage.get(key)
            target = self.home / key
            if not (target.is_file() and read_nofollow(target) == data):
                write_file_under(self.home, target, data)
            self._input_tags[key] = meta.e_tag
        self._synced[memo_key] = now

    def publish_inputs(self, project_id: str, episode_id: str) -> bool:
        """Put the home's project config and story into the storage (create, or replace
        what is there by compare-and-set: two writers cannot silently overwrite each
        other), so every machine reads them. True when an object was replaced: the seals
        that recorded the old one must then be cleared (a judge trusts them otherwise)."""
        replaced = False
        for key in self._input_keys(project_id, episode_id):
            data = read_nofollow(self.home / key)
            found = self.storage.head(key)
            if found is None:
                meta = self.storage.put_create(key, data)
            elif self.storage.get(key) != data:
                meta = self.storage.put_if_match(key, data, found)
                replaced = True
            else:
                meta = found
            self._input_tags[key] = self._seen_inputs[key] = meta.e_tag
        self._synced.pop((project_id, episode_id), None)
        return replaced

    # ------------------------------------------------------------------ write-ahead edits
    def _pending_key(self, mutator: StepKey, victim: str) -> str:
        p, e, s = mutator.project_id, mutator.episode_id, mutator.step_id
        return DataLayout.pending_object(p, e, s, victim)

    def write_pending(self, mutator: StepKey, edited: Checkpoint) -> Path:
        key = self._pending_key(mutator, edited.step_id)
        data = edited.to_json().encode("utf-8")
        found = self.storage.head(key)
        if found is None:
            self.storage.put_create(key, data)
        else:
            self.storage.put_if_match(key, data, found)
        return Path(key)

    def load_pending(self, mutator: StepKey, victim: str) -> Checkpoint | None:
        key = self._pending_key(mutator, victim)
        try:
            payload = self.storage.get(key)
        except PipelineError as exc:
            if exc.code == ErrorCode.STORAGE_OBJECT_MISSING:
                return None
            raise
        try:
            raw = json.loads(payload.decode("utf-8"))
            return Checkpoint.from_dict(raw, source=f"{self.storage.url}/{key}")
        except (UnicodeDecodeError, ValueError, PipelineError):
            return None  # a torn or foreign write-ahead copy is no edit to apply

    def drop_pending(self, mutator: StepKey, victim: str) -> None:
        self.storage.delete(self._pending_key(mutator, victim))


def _under(folder: str, keys: Iterable[str]) -> frozenset[str]:
    """The keys directly in ``folder`` (an episode's input files)."""
    return frozenset(k for k in keys if k.rpartition("/")[0] == folder)
