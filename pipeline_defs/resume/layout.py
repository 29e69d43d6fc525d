"""Where everything lives under ``PIPELINE_HOME``, and how a file's identity is taken.

The one owner of the data layout::

    <home>/ledger.sqlite3                              the default SQLite ledger
    <home>/projects/<p>/project.yaml                   a project's config
    <home>/projects/<p>/episodes/<e>/story.md, ...     an episode's inputs
    <home>/checkpoints/<p>/<e>/<step>/checkpoint.json  a step's checkpoint and artifacts

Pure and string-based: the sensor builds these paths for thousands of partitions a tick,
where pathlib joins cost more than the ``lstat`` calls they feed. Lexical, never resolved
(resolving would follow the links docs/DESIGN.md#no-escape refuses). Ids are not validated here:
callers pass ids already checked (``Episode``, ``StepKey``, ``validate_id``).

The identity helpers are the only definition of "this file or directory is unchanged",
so what the checkpoint store seals and caches and what the sensor watches cannot drift.
Always ``lstat``: a link has its own identity and is noticed, never followed.
"""

import os
from dataclasses import dataclass, field
from pathlib import PurePath

PROJECTS = "projects"
EPISODES = "episodes"
CHECKPOINTS = "checkpoints"
PROJECT_FILE = "project.yaml"
STORY_FILE = "story.md"
LEDGER_FILE = "ledger.sqlite3"

FileIdentity = tuple[int, int, int]  # (st_mtime_ns, st_size, st_ino)
DirIdentity = tuple[int, int]  # (st_mtime_ns, st_ino): moves when an entry is added/removed


@dataclass(frozen=True)
class DataLayout:
    """The paths of one home, as strings (``home`` taken as given: not resolved)."""

    home: str  # a str or os.PathLike on construction; normalized to a str
    # Where the checkpoint tree is when it is not ``<home>/checkpoints``: a process's scratch
    # copy of checkpoints published on object storage (docs/DESIGN.md#storage).
    checkpoints_root: str | None = None
    projects: str = field(init=False)
    checkpoints: str = field(init=False)

    def __post_init__(self) -> None:
        # Spelled as pathlib spells it (no trailing or doubled slash, "" is "."), so these
        # strings equal str() of the Path joins callers used before; once per layout.
        home = str(PurePath(self.home))
        prefix = {".": "", "/": "/"}.get(home, f"{home}/")
        object.__setattr__(self, "home", home)
        object.__setattr__(self, "projects", f"{prefix}{PROJECTS}")
        root = self.checkpoints_root
        checkpoints = str(PurePath(root)) if root is not None else f"{prefix}{CHECKPOINTS}"
        object.__setattr__(self, "checkpoints", checkpoints)

    @property
    def ledger_file(self) -> str:
        return str(PurePath(self.home, LEDGER_FILE))

    # ------------------------------------------------------------------ inputs
    def project_dir(self, project_id: str) -> str:
        return f"{self.projects}/{project_id}"

    def project_file(self, project_id: str) -> str:
        return f"{self.projects}/{project_id}/{PROJECT_FILE}"

    def episodes_dir(self, project_id: str) -> str:
        return f"{self.projects}/{project_id}/{EPISODES}"

    def episode_dir(self, project_id: str, episode_id: str) -> str:
        """The episode's inputs (``story.md``, ...)."""
        return f"{self.projects}/{project_id}/{EPISODES}/{episode_id}"

    def story_file(self, project_id: str, episode_id: str) -> str:
        return f"{self.episode_dir(project_id, episode_id)}/{STORY_FILE}"

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_project_dir(self, project_id: str) -> str:
        return f"{self.checkpoints}/{project_id}"

    def checkpoint_episode_dir(self, project_id: str, episode_id: str) -> str:
        return f"{self.checkpoints}/{project_id}/{episode_id}"

    def step_dir(self, project_id: str, episode_id: str, step_id: str) -> str:
        return f"{self.checkpoints}/{project_id}/{episode_id}/{step_id}"


# ----------------------------------------------------------------------------- identities
def stat_identity(st: os.stat_result) -> FileIdentity:
    """(mtime_ns, size, inode) of a stat result: what seals, caches and scans compare."""
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def dir_stat_identity(st: os.stat_result) -> DirIdentity:
    """(mtime_ns, inode) of a directory's stat result (its size says nothing useful)."""
    return (st.st_mtime_ns, st.st_ino)


def file_identity(path: str | os.PathLike[str]) -> FileIdentity | None:
    """(mtime_ns, size, inode) of the entry at ``path`` (``lstat``), or None when absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def dir_identity(path: str | os.PathLike[str]) -> DirIdentity | None:
    """(mtime_ns, inode) of the entry at ``path`` (``lstat``), or None when absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ino)
