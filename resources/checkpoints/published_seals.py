"""Published checkpoints, the seals: judged from the ledger alone, checked by a scrub.

A seal (:mod:`~resources.checkpoints.object_seal`) names the inputs the verifier read by
the ``e_tag`` of the published object, and the victims by their pointers; this process
trusts it unless it saw otherwise. The scrub compares the storage with an episode's
sealed rows (one LIST per prefix).
"""

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.bucket import BucketCheckpoints
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.manifest import Manifest
from resources.checkpoints.object_seal import ObjectSeal, SealDrift
from resources.checkpoints.paths import StorePaths
from resources.checkpoints.pointer_source import PointerSource, pointer_digest
from resources.checkpoints.published_inputs import PublishedInputs
from resources.checkpoints.seal import Seal

# The manifest a ledger row's pointer names, checked to be the step's own.
Decode = Callable[[StepKey, str], Manifest]


class PublishedSeals:
    """Seals of published checkpoints, and the scrub that voids them."""

    def __init__(
        self,
        paths: StorePaths,
        inputs: PublishedInputs,
        bucket: BucketCheckpoints,
        pointers: PointerSource,
        drifted: set[StepKey],
        decode: Decode,
    ) -> None:
        self.paths = paths
        self.inputs = inputs
        self.bucket = bucket
        self.pointers = pointers
        # Steps a scrub found drifted (shared with the scratch cache, which fetches them
        # again instead of trusting its copy).
        self.drifted = drifted
        self.decode = decode
        self._scope_pointers = threading.local()

    def seal(
        self, checkpoint: Checkpoint, reads: Iterable[Path] = (), *, revision: int = 1
    ) -> str | None:
        """A seal any machine can check from the ledger (:mod:`~resources.checkpoints.
        object_seal`): the inputs the verifier read by the ``e_tag`` of the published
        object this process verified a copy of, the victims by their pointers. None (the
        step is judged the long way) when a read is not a published input or a victim."""
        inputs: dict[str, str] = {}
        victims: dict[str, str] = {}
        home = self.paths.home.resolve()
        checkpoints = Path(self.paths.layout.checkpoints).resolve()
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
                victims[parts[2]] = pointer_digest(pointer)
                continue
            if not resolved.is_relative_to(home):
                return None
            if resolved.is_dir():
                continue  # a folder is the set of its files, all named below
            tag = self.inputs.input_tags.get(resolved.relative_to(home).as_posix())
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

    def sealed(self, key: StepKey, text: Any) -> Seal | None:
        """The seal of ``key`` unless this process knows better: an input whose published
        ``e_tag`` (or folder) it saw differ, a victim whose pointer moved, or a drift its
        scrub found. No request: what the storage holds is the scrub's to compare."""
        seal = ObjectSeal.decode(text)
        if seal is None or key in self.drifted:
            return None
        for input_key, tag in seal.inputs.items():
            seen = self.inputs.seen_inputs.get(input_key, tag)
            if seen != tag:
                return None
        folder = self.inputs.inputs_folder(key.project_id, key.episode_id)
        listed = self.inputs.seen_folders.get(folder)
        if listed is not None and listed != _under(folder, seal.inputs):
            return None  # an input added or removed since the run verified them
        if seal.victims:
            pointers = self._episode_pointers(key.project_id, key.episode_id)
            for step_id, digest in seal.victims.items():
                pointer = pointers.get(step_id)
                if pointer is None or pointer_digest(pointer) != digest:
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
        """Each episode's pointers read once per scope."""
        previous = getattr(self._scope_pointers, "cache", None)
        self._scope_pointers.cache = {}
        try:
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
        folder = self.inputs.inputs_folder(project_id, episode_id)
        listed = {m.key: m.e_tag for m in self.inputs.storage.list(folder)}
        self.inputs.seen_inputs.update(listed)
        self.inputs.seen_folders[folder] = frozenset(listed)
        sealed: dict[str, tuple[Manifest, str, ObjectSeal]] = {}
        for step_id, (pointer, text) in rows.items():
            seal = ObjectSeal.decode(text)
            if pointer is None or seal is None:
                continue
            key = StepKey(project_id, episode_id, step_id)
            try:
                sealed[step_id] = (self.decode(key, pointer), str(text), seal)
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
                self.drifted.add(drift.step)
                found.append(SealDrift(drift.step, text, "; ".join(why)))
        if any(
            k in self.inputs.input_tags and self.inputs.input_tags[k] != t
            for k, t in listed.items()
        ):
            self.inputs.synced.pop((project_id, episode_id), None)  # copy again on the next read
        return found


def _under(folder: str, keys: Iterable[str]) -> frozenset[str]:
    """The keys directly in ``folder`` (an episode's input files)."""
    return frozenset(k for k in keys if k.rpartition("/")[0] == folder)
