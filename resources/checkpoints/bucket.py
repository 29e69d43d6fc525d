"""Checkpoints on object storage: immutable attempts, a manifest as the commit pointer.

Object stores have no rename and no row lock, so the local protocol (stage, then rename
under the row lock) cannot carry over. Instead:

- **Write.** A run writes every object under a prefix of its own attempt,
  ``checkpoints/<p>/<e>/<step>/<attempt>/…``, with create-only puts (``If-None-Match: *``):
  nothing is ever overwritten, and two attempts never share a key.
- **Publish.** The attempt's :class:`~resources.checkpoints.manifest.Manifest` (every object
  by key, size, sha256, e_tag/version) is stored by one owner-aware ledger update, the
  same transaction as the status change. A fenced worker (lease taken over, SIGSTOP) can
  write only into its own dead prefix, and its publish matches no row: it can never
  replace the winner's objects, because it never touches them.
- **Read.** A load verifies what it reads against the manifest: the envelope's sha256 and
  size, then its ``content_hash``; artifacts by head (e_tag/version, size) or in full
  (sha256). Deleted is ``artifact_missing``; overwritten, or replaced by an older copy, is
  ``io.integrity_violation`` naming the object (a block), exactly as on a local disk.
- **Scrub.** The manifest is the seal: an unchanged row is judged from the ledger alone
  (zero requests). Drift is found by one LIST per episode prefix compared with the
  manifests (:meth:`BucketCheckpoints.scrub_episode`), spread over a period by the caller.
- **Collect.** :meth:`BucketCheckpoints.collect` deletes whole attempt prefixes that no
  manifest names (current, archived or pending), that no running attempt owns, and whose
  newest object is older than a grace period. Reused pictures keep their earlier attempt
  alive (an image step's manifest may name objects of a previous attempt, copy-free).

This module knows nothing of the ledger (adapters stay independent): callers hand it the
manifests they read from their rows and store the ones it returns.
"""

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import uuid4

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import (
    ErrorCode,
    PipelineError,
    StorageObjectExists,
    StorageObjectMissing,
)
from pipeline_defs.resume.layout import CHECKPOINTS
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.envelope import EDITED_OUTSIDE, Checkpoint
from resources.checkpoints.manifest import (
    COMPANIONS_NAME,
    ENVELOPE_NAME,
    Manifest,
    ObjectRef,
    encode_companions,
)
from resources.storage import ObjectMeta, Storage

CHECKPOINTS_ROOT = CHECKPOINTS  # the bucket keeps the home's tree of names
ENVELOPE_WHAT = "checkpoint envelope"  # how a fetch names the envelope (a hand edit is told apart)
# An attempt prefix: "a" + the claim's start (sortable, for people) + a digest of the owner.
_ATTEMPT = re.compile(r"^a[0-9A-Za-z]*-[0-9a-f]{16}$")
_STAMP_DROP = re.compile(r"[^0-9A-Za-z]")


def attempt_id(run_id: str, started_at: str) -> str:
    """The attempt prefix of one claim: unique per owner (``run_id`` carries the claim's
    token), sortable by when it was claimed. Never reused by another owner, so a stale
    worker's objects can never land in the winner's prefix. A publication takes one of
    its own (:meth:`BucketCheckpoints.publication`)."""
    stamp = _STAMP_DROP.sub("", started_at)[:24]
    return f"a{stamp}-{hashlib.sha256(run_id.encode('utf-8')).hexdigest()[:16]}"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _integrity(storage: Storage, key: str, problem: str, origin: Origin) -> PipelineError:
    return PipelineError(
        ErrorCode.IO_INTEGRITY_VIOLATION,
        f"object {key} in {storage.url}: {problem}",
        origin=origin.value,
        details={"key": key, "storage": storage.url},
    )


@dataclass
class Attempt:
    """One claim's private writing area: create-only puts, then a manifest."""

    storage: Storage
    step: StepKey
    prefix: str  # checkpoints/<p>/<e>/<step>/<attempt>
    attempt: str
    named: dict[str, ObjectRef] = field(default_factory=dict)
    companions: ObjectRef | None = None

    def key_of(self, relative: str) -> str:
        return f"{self.prefix}/{relative}"

    def put(self, relative: str, data: bytes) -> ObjectRef:
        """Store an artifact of this attempt (create-only) and name it in the manifest.

        Retried after a lost answer, a put finds its own object: identical bytes are taken
        as written; different bytes under our own prefix mean two writers claim one
        attempt, which the ledger's claim rules out, so it is refused loudly.
        """
        ref = self._put(self.key_of(relative), data)
        self.named[relative] = ref
        return ref

    def reuse(self, relative: str, ref: ObjectRef) -> None:
        """Name an object of an earlier attempt (a valid picture kept, copy-free)."""
        self.named[relative] = ref

    def put_companions(self, files: Mapping[str, bytes]) -> None:
        """Store the files named after the artifacts (their receipts) as one object."""
        if files:
            self.companions = self._put(self.key_of(COMPANIONS_NAME), encode_companions(files))

    def publishable(self, checkpoint: Checkpoint) -> Manifest:
        """Put the envelope and return the manifest to publish through the ledger.

        Every artifact the envelope lists must be named with the same sha256 and size:
        the manifest can never claim an object the checkpoint did not verify.
        """
        if checkpoint.key != self.step:
            raise ValueError(f"{checkpoint.key} is not {self.step}")
        artifacts: dict[str, ObjectRef] = {}
        for artifact in checkpoint.artifacts:
            ref = self.named.get(artifact.path)
            if ref is None or ref.sha256 != artifact.sha256 or ref.size != artifact.bytes:
                raise PipelineError(
                    ErrorCode.CHECKPOINT_INVALID,
                    f"{self.step}: artifact {artifact.path} is listed in the checkpoint but "
                    f"was not written (or not with these bytes) in attempt {self.attempt}",
                    origin=Origin.CONTRACT_DRIFT.value,
                )
            artifacts[artifact.path] = ref
        envelope = self._put(self.key_of(ENVELOPE_NAME), checkpoint.to_json().encode("utf-8"))
        return Manifest(
            self.step, self.attempt, envelope, checkpoint.content_hash, artifacts, self.companions
        )

    def _put(self, key: str, data: bytes) -> ObjectRef:
        digest = sha256_bytes(data)
        try:
            meta = self.storage.put_create(key, data)
        except StorageObjectExists:
            if sha256_bytes(self.storage.get(key)) != digest:
                raise
            found = self.storage.head(key)
            if found is None:
                raise
            meta = found
        return ObjectRef(key, len(data), digest, meta.e_tag, meta.version)


@dataclass(frozen=True)
class Drift:
    """What a scrub found for one step: objects its manifest names that are gone or
    are no longer the published bytes."""

    step: StepKey
    missing: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.missing and not self.changed


@dataclass(frozen=True)
class Collection:
    """What :meth:`BucketCheckpoints.collect` did (or, dry, would do)."""

    deleted_prefixes: tuple[str, ...]
    deleted_objects: int
    kept_referenced: int
    kept_running: int
    kept_young: int


class BucketCheckpoints:
    """Checkpoints of one storage (a bucket, or a directory with the same protocol)."""

    def __init__(self, storage: Storage, *, root: str = CHECKPOINTS_ROOT) -> None:
        self.storage = storage
        self.root = root

    # ------------------------------------------------------------------ keys
    def episode_prefix(self, project_id: str, episode_id: str) -> str:
        return f"{self.root}/{project_id}/{episode_id}"

    def step_prefix(self, key: StepKey) -> str:
        return f"{self.root}/{key.project_id}/{key.episode_id}/{key.step_id}"

    def attempt(self, key: StepKey, run_id: str, started_at: str) -> Attempt:
        """The writing area of the claim ``(run_id, started_at)`` on ``key``."""
        name = attempt_id(run_id, started_at)
        return Attempt(self.storage, key, f"{self.step_prefix(key)}/{name}", name)

    def publication(self, key: StepKey, owner: str, *, now: datetime | None = None) -> Attempt:
        """A writing area of its own for one publication of ``key`` by ``owner`` (a run, a
        review's edit, an accept): named by when it is written and a fresh token, so no
        two publications ever share a key, whatever their content. Naming it by the
        content instead made a publication of content published before (an accept back
        to the original words, a review edit that flips a field back) collide with that
        publication's create-only envelope, for good."""
        stamp = format_timestamp(now or datetime.now(UTC))
        return self.attempt(key, f"{owner}|{uuid4().hex}", stamp)

    # ------------------------------------------------------------------ reads
    def held(self, manifest: Manifest) -> dict[str, ObjectMeta | None]:
        """What the storage holds now under every key ``manifest`` names (None: no object):
        one LIST of its step's prefix, whatever its number of objects (a key named outside
        it, not expected: one HEAD). Compare with :meth:`ObjectRef.same_object`."""
        prefix = self.step_prefix(manifest.step)
        listed = {meta.key: meta for meta in self.storage.list(prefix)}
        out: dict[str, ObjectMeta | None] = {}
        for key in sorted(manifest.keys):
            found = listed.get(key)
            if found is None and not key.startswith(f"{prefix}/"):
                found = self.storage.head(key)
            out[key] = found
        return out

    def load(self, manifest: Manifest | None) -> Checkpoint | None:
        """The published checkpoint, verified; None when nothing is published or its
        envelope object is gone (a completed row without its checkpoint: re-run self).

        Replaced bytes (an overwrite, an older copy put back) fail the sha256 check before
        the envelope is parsed; an envelope edited together with a forged manifest still
        fails its own ``content_hash``.
        """
        if manifest is None:
            return None
        ref = manifest.envelope
        payload = self.fetch(ref, what=ENVELOPE_WHAT)
        if payload is None:
            return None
        try:
            raw = json.loads(payload.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise _integrity(
                self.storage, ref.key, f"is not a JSON envelope ({exc})", Origin.CONTRACT_DRIFT
            ) from None
        checkpoint = Checkpoint.from_dict(raw, source=f"{self.storage.url}/{ref.key}")
        if checkpoint.key != manifest.step or checkpoint.content_hash != manifest.content_hash:
            raise _integrity(
                self.storage,
                ref.key,
                f"belongs to {checkpoint.key} with content {checkpoint.content_hash}, not to "
                f"the published {manifest.step} ({manifest.content_hash})",
                Origin.CONTRACT_DRIFT,
            )
        return checkpoint

    def fetch(self, ref: ObjectRef, *, what: str = "object") -> bytes | None:
        """An object's bytes verified against its reference (size and sha256); None when
        the object is gone, ``io.integrity_violation`` naming it when replaced."""
        payload = self.fetch_unverified(ref.key)
        if payload is None:
            return None
        if what == ENVELOPE_WHAT and not self._matches(ref, payload):
            _refuse_hand_edit(self.storage, ref.key, payload)
        self._verify(ref, payload, what=what)
        return payload

    def fetch_unverified(self, key: str) -> bytes | None:
        """An object's bytes as the storage holds them now (None: gone). For an operator's
        edit, which an accept validates itself; every other read verifies."""
        try:
            return self.storage.get(key)
        except StorageObjectMissing:
            return None

    @staticmethod
    def _matches(ref: ObjectRef, payload: bytes) -> bool:
        return len(payload) == ref.size and sha256_bytes(payload) == ref.sha256

    def read_artifact(self, manifest: Manifest, relative: str) -> bytes:
        """An artifact's bytes, verified against the manifest (a run's full check)."""
        ref = manifest.artifacts.get(relative)
        if ref is None:
            raise PipelineError(
                ErrorCode.IO_CHECKPOINT_MISSING,
                f"{manifest.step}: no artifact {relative} in the published checkpoint",
            )
        payload = self.storage.get(ref.key)
        self._verify(ref, payload, what=f"artifact {relative}")
        return payload

    def artifact_problems(
        self, manifest: Manifest, *, full: bool = True
    ) -> tuple[list[str], list[str]]:
        """(absent artifacts, artifacts that are not the published bytes).

        ``full`` (runs, the IO manager) reads and hashes every object; otherwise one HEAD
        each compares size and e_tag/version (what a scrub compares, per object).
        """
        missing: list[str] = []
        changed: list[str] = []
        for relative, ref in sorted(manifest.artifacts.items()):
            meta = self.storage.head(ref.key)
            if meta is None:
                missing.append(f"{relative} (missing)")
            elif not ref.same_object(meta.size, meta.e_tag, meta.version):
                changed.append(f"{relative} (replaced: not the published object)")
            elif full and sha256_bytes(self.storage.get(ref.key)) != ref.sha256:
                changed.append(f"{relative} (sha256 mismatch)")
        return missing, changed

    def _verify(self, ref: ObjectRef, payload: bytes, *, what: str) -> None:
        if not self._matches(ref, payload):
            raise _integrity(
                self.storage,
                ref.key,
                f"the {what} is not the published one (sha256 {sha256_bytes(payload)[:12]}…, "
                f"{len(payload)} bytes; published {ref.sha256[:12]}…, {ref.size} bytes): it "
                "was overwritten or replaced by another copy",
                Origin.INVARIANT_DRIFT,
            )

    # ------------------------------------------------------------------ discovery
    def discover(self, key: StepKey) -> Manifest | None:
        """The newest complete attempt of ``key`` the storage holds, as a manifest to adopt
        when the ledger lost the step's row (a local home adopts the orphan checkpoint file
        the same way, after verification): one LIST of the step's prefix, then the newest
        attempt whose envelope reads as ``key``'s checkpoint and whose every artifact has an
        object of the listed size (in that attempt, else in an earlier one: a kept picture
        is named copy-free). Its bytes are verified when the manifest is loaded; None when
        no attempt is complete."""
        prefix = self.step_prefix(key)
        by_attempt: dict[str, dict[str, ObjectMeta]] = {}
        for meta in self.storage.list(prefix):
            attempt, _, relative = meta.key.removeprefix(f"{prefix}/").partition("/")
            if relative and _ATTEMPT.match(attempt):
                by_attempt.setdefault(attempt, {})[relative] = meta
        newest_first = sorted(by_attempt, reverse=True)
        for attempt in newest_first:
            objects = by_attempt[attempt]
            envelope_meta = objects.get(ENVELOPE_NAME)
            if envelope_meta is None:
                continue
            payload = self.fetch_unverified(envelope_meta.key)
            try:
                checkpoint = Checkpoint.from_dict(json.loads(payload or b""), source=prefix)
            except (PipelineError, ValueError, TypeError):
                continue
            if checkpoint.key != key:
                continue
            artifacts: dict[str, ObjectRef] = {}
            for artifact in checkpoint.artifacts:
                found = next(
                    (
                        by_attempt[other][artifact.path]
                        for other in [attempt, *newest_first]
                        if artifact.path in by_attempt[other]
                        and by_attempt[other][artifact.path].size == artifact.bytes
                    ),
                    None,
                )
                if found is None:
                    break
                artifacts[artifact.path] = _ref(found, artifact.sha256)
            else:
                assert payload is not None
                companions = objects.get(COMPANIONS_NAME)
                bundle = None if companions is None else self.fetch_unverified(companions.key)
                return Manifest(
                    key,
                    attempt,
                    _ref(envelope_meta, sha256_bytes(payload)),
                    checkpoint.content_hash,
                    artifacts,
                    None
                    if companions is None or bundle is None
                    else _ref(companions, sha256_bytes(bundle)),
                )
        return None

    # ------------------------------------------------------------------ scrub
    def scrub_episode(
        self, project_id: str, episode_id: str, manifests: Iterable[Manifest]
    ) -> list[Drift]:
        """One LIST of the episode's prefix, compared with every published manifest of it.

        The request cost is one LIST (paged by the store) per episode, whatever its number
        of steps and objects: what lets a caller spread a full pass over a period with a
        known request rate.
        """
        listed: dict[str, ObjectMeta] = {
            meta.key: meta
            for meta in self.storage.list(self.episode_prefix(project_id, episode_id))
        }
        out: list[Drift] = []
        for manifest in manifests:
            missing: list[str] = []
            changed: list[str] = []
            for name, ref in [(ENVELOPE_NAME, manifest.envelope), *manifest.artifacts.items()]:
                meta = listed.get(ref.key)
                if meta is None:
                    if not ref.key.startswith(self.episode_prefix(project_id, episode_id) + "/"):
                        meta = self.storage.head(ref.key)  # named elsewhere (not expected)
                    if meta is None:
                        missing.append(name)
                        continue
                if not ref.same_object(meta.size, meta.e_tag, meta.version):
                    changed.append(name)
            out.append(Drift(manifest.step, tuple(missing), tuple(changed)))
        return out

    # ------------------------------------------------------------------ garbage
    def attempts(self) -> Iterator[tuple[str, list[ObjectMeta]]]:
        """Every attempt prefix with its objects (one LIST of the checkpoints root)."""
        grouped: dict[str, list[ObjectMeta]] = {}
        for meta in self.storage.list(self.root):
            parts = meta.key.split("/")
            # checkpoints/<p>/<e>/<step>/<attempt>/...
            if len(parts) >= 6 and _ATTEMPT.match(parts[4]):
                grouped.setdefault("/".join(parts[:5]), []).append(meta)
        yield from sorted(grouped.items())

    def collect(
        self,
        referenced: Iterable[Manifest],
        running: Iterable[str],
        *,
        now: datetime,
        grace: timedelta,
        dry_run: bool = False,
        attempts: Iterable[tuple[str, list[ObjectMeta]]] | None = None,
    ) -> Collection:
        """Delete attempt prefixes no manifest names, no running attempt owns, and whose
        newest object is older than ``grace``; keep everything else.

        ``referenced``: every manifest any row names (current, archived, pending review
        edits); ``running``: prefixes being worked on, attempt prefixes or whole step
        prefixes (a running row may be uploading any attempt of its step: each publication
        names its attempt with a fresh token, which only the worker knows before its commit).
        A prefix is kept whole when any object in it is named (reused pictures keep theirs
        alive). An object whose age the store does not report counts as young.
        ``attempts``: the listing to judge (``attempts()`` by default), taken before the
        caller read ``referenced`` and ``running``.
        """
        named: set[str] = set()
        for manifest in referenced:
            named |= {_attempt_of(key) for key in manifest.keys}
        running_set = set(running)
        deleted: list[str] = []
        objects = kept_referenced = kept_running = kept_young = 0
        for prefix, metas in self.attempts() if attempts is None else attempts:
            if prefix in named:
                kept_referenced += 1
                continue
            if prefix in running_set or prefix.rpartition("/")[0] in running_set:
                kept_running += 1
                continue
            stamps = [m.last_modified for m in metas]
            if any(s is None for s in stamps) or max(s for s in stamps if s) > now - grace:
                kept_young += 1
                continue
            deleted.append(prefix)
            if not dry_run:
                for meta in metas:
                    self.storage.delete(meta.key)
            objects += len(metas)
        return Collection(tuple(deleted), objects, kept_referenced, kept_running, kept_young)


def _refuse_hand_edit(storage: Storage, key: str, payload: bytes) -> None:
    """An envelope object that still parses as an envelope but whose content no longer
    gives its stored content hash was edited by hand (downloaded, edited, put back): say
    so, as on a local disk, so the way out offered is ``storyboard accept``. Anything else
    is left to the caller's "not the published one"."""
    try:
        raw = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return
    if not isinstance(raw, dict):
        return
    try:
        Checkpoint.from_dict(raw, source=f"{storage.url}/{key}")
    except PipelineError as exc:
        if EDITED_OUTSIDE in exc.message:
            raise
    return


def _ref(meta: ObjectMeta, sha256: str) -> ObjectRef:
    """An object as listed, named with the sha256 its bytes must have (verified on read)."""
    return ObjectRef(meta.key, meta.size, sha256, meta.e_tag, meta.version)


def _attempt_of(key: str) -> str:
    """``checkpoints/p/e/step/attempt`` of an object key below an attempt."""
    return "/".join(key.split("/")[:5])
