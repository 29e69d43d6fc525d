"""Published checkpoints, the write-ahead edits: a mutator's edits live in the storage
(``pending/…``), so another machine settles them after a crash."""

import json
from pathlib import Path

from pipeline_defs.resume.errors import PipelineError, StorageObjectMissing
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.bucket import BucketCheckpoints
from resources.checkpoints.envelope import Checkpoint
from resources.storage import Storage


class PublishedPending:
    """A mutator's write-ahead edits as objects (compare-and-set, never silently lost)."""

    def __init__(self, bucket: BucketCheckpoints) -> None:
        self._bucket = bucket

    @property
    def storage(self) -> Storage:
        return self._bucket.storage

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
        except StorageObjectMissing:
            return None
        try:
            raw = json.loads(payload.decode("utf-8"))
            return Checkpoint.from_dict(raw, source=f"{self.storage.url}/{key}")
        except (UnicodeDecodeError, ValueError, PipelineError):
            return None  # a torn or foreign write-ahead copy is no edit to apply

    def drop_pending(self, mutator: StepKey, victim: str) -> None:
        self.storage.delete(self._pending_key(mutator, victim))
