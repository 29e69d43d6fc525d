"""Published checkpoints, the inputs: the project config and stories every machine reads.

The storage holds them; each home keeps a copy (:meth:`PublishedInputs.sync_inputs`), and
``storyboard add-episode`` puts a home's inputs there (:meth:`PublishedInputs.publish_inputs`).
"""

import time
from pathlib import Path

from pipeline_defs.resume.files import read_nofollow, write_file_under
from pipeline_defs.resume.layout import DataLayout
from resources.checkpoints.bucket import BucketCheckpoints
from resources.storage import ObjectMeta, Storage

# How long a process trusts its copy of an episode's inputs before asking the storage again.
INPUTS_MAX_AGE_SECONDS = 5.0


class PublishedInputs:
    """The inputs of published checkpoints: copied into the home, put into the storage, and
    what this process last saw of them (the seals are checked against it)."""

    def __init__(self, home: Path, bucket: BucketCheckpoints) -> None:
        self.home = home
        self.layout = DataLayout.of(home)
        self._bucket = bucket
        self._home_prefix = f"{self.layout.home}/"
        # (project, episode) -> when its inputs were last synced; input key -> the e_tag of
        # the local copy.
        self.synced: dict[tuple[str, str | None], float] = {}
        self.input_tags: dict[str, str | None] = {}
        # What this process last saw in the storage (a sync or a scrub): input key -> e_tag,
        # and the keys of each episode's input folder. Seals are checked against these.
        self.seen_inputs: dict[str, str | None] = {}
        self.seen_folders: dict[str, frozenset[str]] = {}

    @property
    def storage(self) -> Storage:
        """The storage the bucket's checkpoints (and the inputs) live in."""
        return self._bucket.storage

    def inputs_folder(self, project_id: str, episode_id: str) -> str:
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
        if now - self.synced.get(memo_key, -INPUTS_MAX_AGE_SECONDS) < INPUTS_MAX_AGE_SECONDS:
            return
        found: dict[str, ObjectMeta] = {}
        project_file = self._input_keys(project_id, None)[0]
        meta = self.storage.head(project_file)
        if meta is not None:
            found[project_file] = meta
        if episode_id is not None:
            folder = self.inputs_folder(project_id, episode_id)
            listed = {m.key: m for m in self.storage.list(folder)}
            self.seen_folders[folder] = frozenset(listed)
            found.update(listed)
        for key, meta in sorted(found.items()):
            self.seen_inputs[key] = meta.e_tag
            if self.input_tags.get(key) == meta.e_tag and (self.home / key).is_file():
                continue
            data = self.storage.get(key)
            target = self.home / key
            if not (target.is_file() and read_nofollow(target) == data):
                write_file_under(self.home, target, data)
            self.input_tags[key] = meta.e_tag
        self.synced[memo_key] = now

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
            self.input_tags[key] = self.seen_inputs[key] = meta.e_tag
        self.synced.pop((project_id, episode_id), None)
        return replaced
