"""Project configs for a batch judgement: each ``project.yaml`` read again only when its
identity changes, a step's scoped config computed (and hashed) once per project.
Dagster-free.
"""

import functools
import os
from pathlib import Path

from pipeline_defs.project import (
    ProjectConfig,
    load_project_config,
    project_config_path,
    refuse_project_links,
)
from pipeline_defs.resume.decision_types import ScopedConfig, config_hash
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.identity import (
    REFUSED,
    Identity,
    file_identity_or_absent,
)
from pipeline_defs.steps.judge import ProjectConfigs


class ProjectCache(ProjectConfigs):
    """Project configs by project id, re-read only when ``project.yaml`` changes identity;
    a step's scoped config of one computed once (the judges of a batch share this)."""

    def __init__(self, home: os.PathLike[str] | str) -> None:
        super().__init__(Path(home))
        self._entries: dict[str, tuple[Identity, ProjectConfig | PipelineError]] = {}
        self._checked: set[str] = set()
        self._scoped: dict[tuple[int, tuple[str, ...]], tuple[ProjectConfig, ScopedConfig]] = {}

    def refresh(self) -> None:
        """Start a new evaluation: every project file is stat'ed again on first use."""
        self._checked.clear()

    def get(self, project_id: str) -> ProjectConfig:
        entry = self._entries.get(project_id)
        if entry is None or project_id not in self._checked:
            identity = file_identity_or_absent(str(project_config_path(self.home, project_id)))
            refused: PipelineError | None = None
            try:
                # A link planted above the file leaves its identity as it was: check the
                # way down once per evaluation (a few lstats per project).
                refuse_project_links(self.home, project_id)
            except PipelineError as exc:
                refused = exc
            if refused is not None:
                entry = (REFUSED, refused)  # read again once the link is gone
                self._entries[project_id] = entry
            elif entry is None or entry[0] != identity:
                value: ProjectConfig | PipelineError
                try:
                    value = load_project_config(self.home, project_id)
                except PipelineError as exc:
                    value = exc
                entry = (identity, value)
                self._entries[project_id] = entry
            self._checked.add(project_id)
        if isinstance(entry[1], PipelineError):
            raise entry[1].with_traceback(None)  # a fresh traceback each time
        return entry[1]

    def scoped(self, project: ProjectConfig, keys: tuple[str, ...]) -> ScopedConfig:
        slot = (id(project), keys)
        cached = self._scoped.get(slot)
        if cached is not None and cached[0] is project:
            return cached[1]
        scoped = HashedScopedConfig(super().scoped(project, keys).fingerprints)
        self._scoped[slot] = (project, scoped)
        return scoped


class HashedScopedConfig(ScopedConfig):
    """The same scoped config, its hash computed once (it is read for every judgement)."""

    @functools.cached_property
    def hash(self) -> str:
        return config_hash(self.fingerprints)
