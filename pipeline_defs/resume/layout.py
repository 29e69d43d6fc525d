"""Where everything lives under ``PIPELINE_HOME``.

The one owner of the data layout::

    <home>/ledger.sqlite3                              the default SQLite ledger
    <home>/projects/<p>/project.yaml                   a project's config
    <home>/projects/<p>/episodes/<e>/story.md, ...     an episode's inputs
    <home>/checkpoints/<p>/<e>/<step>/checkpoint.json  a step's checkpoint and artifacts
    <home>/checkpoints/<p>/<e>/<step>/archive/         replaced and force-cleared versions
    <home>/checkpoints/<p>/<e>/<step>/pending/<v>.json a mutator's write-ahead edit of <v>
    <home>/checkpoints/<p>/<e>/<step>/.force_cleared   the force marker
    <home>/checkpoints/<p>/<e>/<step>/.staging/        a run's drawn files before publishing
    <home>/checkpoints/<p>/<e>/<step>/.published       (object storage) the pointer a copy holds
    <home>/.scratch/<process>/checkpoints/...          (object storage) a process's copy

Pure and string-based: the sensor builds these paths for thousands of partitions a tick,
where pathlib joins cost more than the ``lstat`` calls they feed. Lexical, never resolved
(resolving would follow the links docs/DESIGN.md#no-escape refuses). Ids are not validated here:
callers pass ids already checked (``Episode``, ``StepKey``, ``validate_id``).

Stat identities live in :mod:`pipeline_defs.resume.identity`; their names are re-exported
here for the callers that took them from this module.
"""

from dataclasses import dataclass, field
from pathlib import PurePath

from pipeline_defs.resume.identity import (  # re-exported: callers import them from here
    DirIdentity,
    FileIdentity,
    dir_identity,
    dir_stat_identity,
    file_identity,
    stat_identity,
)

__all__ = [
    "ARCHIVE_DIR",
    "CHECKPOINTS",
    "CHECKPOINT_FILE",
    "EPISODES",
    "FORCE_MARKER",
    "LEDGER_FILE",
    "PENDING_DIR",
    "PROJECTS",
    "PROJECT_FILE",
    "PUBLISHED_MARKER",
    "SCRATCH_DIR",
    "STAGING_DIR",
    "STORY_FILE",
    "DataLayout",
    "DirIdentity",
    "FileIdentity",
    "dir_identity",
    "dir_stat_identity",
    "file_identity",
    "stat_identity",
]

PROJECTS = "projects"
EPISODES = "episodes"
CHECKPOINTS = "checkpoints"
PROJECT_FILE = "project.yaml"
STORY_FILE = "story.md"
LEDGER_FILE = "ledger.sqlite3"
SCRATCH_DIR = ".scratch"  # per-process copies of published checkpoints, never the truth
# In a step directory:
CHECKPOINT_FILE = "checkpoint.json"
ARCHIVE_DIR = "archive"
PENDING_DIR = "pending"  # a mutator's write-ahead edits of its victims (steps.mutations)
FORCE_MARKER = ".force_cleared"
STAGING_DIR = ".staging"  # a run's drawn files before they are fenced into place
PUBLISHED_MARKER = ".published"  # names the pointer a scratch step directory holds a copy of


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

    @property
    def scratch_dir(self) -> str:
        """Where processes keep their copies of checkpoints published on object storage."""
        return str(PurePath(self.home, SCRATCH_DIR))

    def process_scratch(self, process: str) -> str:
        """One process's own scratch tree (``process`` names it: host, pid, a nonce)."""
        return f"{self.scratch_dir}/{process}"

    def scratch_checkpoints(self, process: str) -> str:
        """The checkpoint tree of one process's scratch: its ``checkpoints_root``."""
        return f"{self.process_scratch(process)}/{CHECKPOINTS}"

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

    # ------------------------------------------------------------------ in a step directory
    def checkpoint_file(self, project_id: str, episode_id: str, step_id: str) -> str:
        return f"{self.checkpoints}/{project_id}/{episode_id}/{step_id}/{CHECKPOINT_FILE}"

    def archive_dir(self, project_id: str, episode_id: str, step_id: str) -> str:
        return f"{self.checkpoints}/{project_id}/{episode_id}/{step_id}/{ARCHIVE_DIR}"

    def pending_dir(self, project_id: str, episode_id: str, step_id: str) -> str:
        return f"{self.checkpoints}/{project_id}/{episode_id}/{step_id}/{PENDING_DIR}"

    def pending_file(self, project_id: str, episode_id: str, step_id: str, victim: str) -> str:
        """The write-ahead edit of ``victim`` by the mutator step ``step_id``."""
        return f"{self.pending_dir(project_id, episode_id, step_id)}/{victim}.json"

    def force_marker(self, project_id: str, episode_id: str, step_id: str) -> str:
        return f"{self.checkpoints}/{project_id}/{episode_id}/{step_id}/{FORCE_MARKER}"

    def staging_dir(self, project_id: str, episode_id: str, step_id: str) -> str:
        return f"{self.checkpoints}/{project_id}/{episode_id}/{step_id}/{STAGING_DIR}"

    def published_marker(self, project_id: str, episode_id: str, step_id: str) -> str:
        return f"{self.checkpoints}/{project_id}/{episode_id}/{step_id}/{PUBLISHED_MARKER}"
