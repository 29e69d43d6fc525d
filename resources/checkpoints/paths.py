"""Where a checkpoint store's files are: a step's paths by key, kept for judging in bulk.

The names come from the one data layout (:class:`~pipeline_defs.resume.layout.DataLayout`);
this module only remembers them per key, because pathlib joins are slow when the judge asks
for every step of every episode.
"""

import functools
import posixpath
from pathlib import Path

from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import StepKey

MAX_CACHED_PATHS = 200_000  # keys whose paths are remembered (then forgotten at once)


@functools.lru_cache(maxsize=4096)
def artifact_dirs(artifacts: tuple[str, ...]) -> tuple[str, ...]:
    """The directories (relative to the step directory, parents first) holding artifacts."""
    found: dict[str, None] = {}
    for relative in artifacts:
        parts = posixpath.normpath(relative).split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            found.setdefault("/".join(parts[:depth]))
    return tuple(found)


class StorePaths:
    """The paths of one home's checkpoint tree, by step key."""

    def __init__(self, home: Path, *, checkpoints_root: str | None = None) -> None:
        self.home = Path(home)
        self.layout = DataLayout.of(self.home, checkpoints_root)
        self.root = Path(self.layout.checkpoints)
        # As plain strings: the judge joins them for every step of every episode.
        self.home_text, self.root_text = str(self.home), str(self.root)
        # (step dir, checkpoint path) per key: pathlib joins are slow when judging in bulk.
        self._paths: dict[StepKey, tuple[Path, Path]] = {}
        # The directories from the home down to each key's step dir, as plain strings: the
        # judge lstats them for every step of every episode (no pathlib on that path).
        self._chains: dict[StepKey, tuple[str, str, str, str]] = {}

    def paths_of(self, key: StepKey) -> tuple[Path, Path]:
        found = self._paths.get(key)
        if found is None:
            if len(self._paths) >= MAX_CACHED_PATHS:
                self._paths.clear()
            p, e, s = key.project_id, key.episode_id, key.step_id
            found = self._paths[key] = (
                Path(self.layout.step_dir(p, e, s)),
                Path(self.layout.checkpoint_file(p, e, s)),
            )
        return found

    def chain_of(self, key: StepKey) -> tuple[str, str, str, str]:
        """checkpoints root, project, episode and step directory of ``key``."""
        found = self._chains.get(key)
        if found is None:
            if len(self._chains) >= MAX_CACHED_PATHS:
                self._chains.clear()
            layout, p, e = self.layout, key.project_id, key.episode_id
            found = self._chains[key] = (
                self.root_text,
                layout.checkpoint_project_dir(p),
                layout.checkpoint_episode_dir(p, e),
                layout.step_dir(p, e, key.step_id),
            )
        return found

    def step_dir(self, key: StepKey) -> Path:
        return self.paths_of(key)[0]

    def path_for(self, key: StepKey) -> Path:
        return self.paths_of(key)[1]

    def force_marker_path(self, key: StepKey) -> Path:
        return Path(self.layout.force_marker(key.project_id, key.episode_id, key.step_id))

    def archive_dir(self, key: StepKey) -> Path:
        return Path(self.layout.archive_dir(key.project_id, key.episode_id, key.step_id))

    def pending_path(self, mutator: StepKey, victim: str) -> Path:
        """Where ``mutator`` writes ahead its edit of the step ``victim``."""
        p, e, s = mutator.project_id, mutator.episode_id, mutator.step_id
        return Path(self.layout.pending_file(p, e, s, victim))
