"""The checkpoint tree of one directory: the files every store works on.

A home's tree is the truth on a local disk; over a bucket it is this process's scratch copy
(:mod:`resources.checkpoints.scratch_cache`). Either way the same parts, each of one
concern, work on it side by side:

- :mod:`~resources.checkpoints.paths`: a step's paths by key (``StorePaths``);
- :mod:`~resources.checkpoints.links`: the symlink policy, no escape from the home
  (docs/DESIGN.md#no-escape) (``LinkPolicy``);
- :mod:`~resources.checkpoints.reading`: loading, the envelope cache (``EnvelopeReader``);
- :mod:`~resources.checkpoints.archives`: archives and force (``Archives``);
- :mod:`~resources.checkpoints.staging`: writing artifacts, staging envelopes (``Publisher``).
"""

import os
import posixpath
import stat as stat_module
from collections.abc import Iterable, Iterator
from pathlib import Path

from pipeline_defs.resume.files import file_sha256
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.archives import Archives
from resources.checkpoints.links import LinkPolicy
from resources.checkpoints.paths import StorePaths
from resources.checkpoints.reading import EnvelopeReader
from resources.checkpoints.staging import Publisher


class CheckpointTree:
    """The parts that work on one directory's checkpoint files."""

    def __init__(
        self, home: Path, *, keep_archives: int = 5, checkpoints_root: str | None = None
    ) -> None:
        self.paths = StorePaths(home, checkpoints_root=checkpoints_root)
        self.links = LinkPolicy(self.paths)
        self.envelopes = EnvelopeReader(self.paths, self.links)
        self.archives = Archives(self.paths, self.links, self.envelopes, keep_archives)
        self.publisher = Publisher(self.paths, self.links, self.envelopes, self.archives)

    def with_companions(self, key: StepKey, artifacts: Iterable[str]) -> list[str]:
        """Each artifact and the entries beside it named after it (``C01.png`` ->
        ``C01.png.receipt.json``): what a re-run reads or replaces along with it, and what a
        publication on a bucket carries with the artifact. Each directory is scanned once."""
        out: list[str] = []
        listed: dict[str, list[str]] = {}  # artifact directory -> its entries
        base = self.paths.step_dir(key)
        for relative in artifacts:
            out.append(relative)
            folder, name = posixpath.split(posixpath.normpath(relative))
            if folder not in listed:
                try:
                    with os.scandir(base / folder if folder else base) as entries:
                        listed[folder] = sorted(e.name for e in entries)
                except (FileNotFoundError, NotADirectoryError):
                    listed[folder] = []
            prefix = f"{name}."
            out.extend(posixpath.join(folder, n) for n in listed[folder] if n.startswith(prefix))
        return out

    def not_regular(self, key: StepKey, relatives: Iterable[str]) -> tuple[Path, int] | None:
        """The first of ``relatives`` (paths in ``key``'s step directory) that exists and is
        not a regular file, with its ``lstat`` mode; None when each is one or is absent.

        Reached through ``artifact_path``: a link on the way raises ``checkpoint.symlink``
        instead of being followed.
        """
        for relative in relatives:
            path = self.links.artifact_path(key, relative)
            try:
                mode = os.lstat(path).st_mode
            except (FileNotFoundError, NotADirectoryError):
                continue  # absent: a re-run writes it (NotADirectory: the parent reports)
            if not stat_module.S_ISREG(mode):
                return path, mode
        return None

    def artifact_sha256(self, key: StepKey, relative: str) -> str | None:
        """The sha256 of an artifact's bytes as they are now in ``key``'s step directory;
        None when it is absent or not a file (``not_regular`` reports that). Reached
        through ``artifact_path``: a link on the way raises ``checkpoint.symlink``."""
        try:
            return file_sha256(self.links.artifact_path(key, relative))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def episode_input_files(self, key: StepKey) -> list[Path]:
        """The regular files directly in ``key``'s episode input directory
        (``projects/<p>/episodes/<e>/``), sorted; [] when it cannot be listed (absent, not
        a directory, unreadable). What a verdict depends on besides the step's own files.

        ``is_file`` follows links: a linked input counts as the file it points to.
        """
        inputs = Path(self.paths.layout.episode_dir(key.project_id, key.episode_id))
        try:
            return sorted(p for p in inputs.iterdir() if p.is_file())
        except OSError:
            return []

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

        if self.links.lstat_ours(self.paths.root, "a directory") is None:
            return
        for project in real_dirs(str(self.paths.root)):
            if project.is_symlink():
                continue
            for episode in real_dirs(project.path):
                if episode.is_symlink():
                    continue
                for step in real_dirs(episode.path):
                    if step.is_symlink() or os.path.lexists(DataLayout.checkpoint_in(step.path)):
                        yield StepKey(project.name, episode.name, step.name)
