"""Partition and step identities. Ids are validated before they reach a path or a query."""

import re
from dataclasses import dataclass

from pipeline_defs.resume.errors import ErrorCode, PipelineError

ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


_VALID: set[str] = set()  # ids already checked (a sensor tick builds 100,000s of keys)
_VALID_LIMIT = 200_000


def validate_id(value: object, what: str) -> str:
    """Return ``value`` if it is a safe id, else raise ``input.invalid_id`` naming it."""
    if type(value) is str and value in _VALID:
        return value
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise PipelineError(
            ErrorCode.INPUT_INVALID_ID,
            f"invalid {what} {value!r}: ids must match [A-Za-z0-9_-]{{1,64}}",
            details={"field": what},
        )
    # Ids end up as words of shell commands: the ones we print (`storyboard force
    # --partition p/e --step s`) and the operator's own on the paths (`ls projects/<p>`,
    # `rm -r <e>`). A word that starts with "-" reads as an option there (`-rf`).
    if value.startswith("-"):
        raise PipelineError(
            ErrorCode.INPUT_INVALID_ID,
            f"invalid {what} {value!r}: an id must not start with '-' (it would read as an "
            "option in the commands that name it)",
            details={"field": what},
        )
    if type(value) is str:
        if len(_VALID) >= _VALID_LIMIT:
            _VALID.clear()
        _VALID.add(value)
    return value


@dataclass(frozen=True, order=True)
class Episode:
    """One Dagster partition of the ``episodes`` dynamic partitions: ``<project>/<episode>``."""

    project_id: str
    episode_id: str

    def __post_init__(self) -> None:
        validate_id(self.project_id, "project_id")
        validate_id(self.episode_id, "episode_id")

    @property
    def partition_key(self) -> str:
        return f"{self.project_id}/{self.episode_id}"

    @classmethod
    def parse(cls, partition_key: str) -> "Episode":
        parts = partition_key.split("/") if isinstance(partition_key, str) else []
        if len(parts) != 2:
            raise PipelineError(
                ErrorCode.INPUT_INVALID_ID,
                f"invalid partition key {partition_key!r}: expected <project_id>/<episode_id>",
                details={"field": "partition_key"},
            )
        return cls(parts[0], parts[1])

    def step(self, step_id: str) -> "StepKey":
        return StepKey(self.project_id, self.episode_id, step_id)


@dataclass(frozen=True, order=True)
class StepKey:
    """The ledger's natural key: one step of one episode."""

    project_id: str
    episode_id: str
    step_id: str

    def __post_init__(self) -> None:
        validate_id(self.project_id, "project_id")
        validate_id(self.episode_id, "episode_id")
        validate_id(self.step_id, "step_id")

    @classmethod
    def of(cls, project_id: str, episode_id: str, step_id: str) -> "StepKey":
        """The same key as ``StepKey(...)``, validated the same way, built without the frozen
        ``__init__`` (one ``__setattr__`` per field): a bulk read builds one per row."""
        made = object.__new__(cls)
        made.__dict__.update(
            project_id=validate_id(project_id, "project_id"),
            episode_id=validate_id(episode_id, "episode_id"),
            step_id=validate_id(step_id, "step_id"),
        )
        return made

    @property
    def episode(self) -> Episode:
        return Episode(self.project_id, self.episode_id)

    @property
    def partition_key(self) -> str:
        return f"{self.project_id}/{self.episode_id}"

    def __str__(self) -> str:
        return f"{self.partition_key}:{self.step_id}"
