"""The checkpoint envelope: a step's persisted output for one partition, plus provenance."""

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.decision import CheckpointSummary
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey

SECRET_MARKERS = ("api_key", "password", "secret", "token", "credential")
MASK = "***"

REQUIRED_FIELDS = (
    "step_id",
    "project_id",
    "episode_id",
    "status",
    "schema_version",
    "config_hash",
    "resume_config_keys",
    "project_config_snapshot",
    "data",
    "artifacts",
    "produced_by",
    "created_at",
    "mutations",
)


def canonical_json(value: Any) -> str:
    """Stable text for hashing: sorted keys, no whitespace, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_secret_key(key: str) -> bool:
    lowered = key.lower()
    return any(marker in lowered for marker in SECRET_MARKERS)


def mask_secrets(value: Any) -> Any:
    """Copy of ``value`` with every secret-looking key's value replaced, at any depth."""
    if isinstance(value, Mapping):
        return {
            str(k): (MASK if is_secret_key(str(k)) and v not in (None, "") else mask_secrets(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [mask_secrets(v) for v in value]
    return value


@dataclass(frozen=True)
class Artifact:
    """A file a step produced, relative to its step directory, with its content hash."""

    path: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Checkpoint:
    """SPEC §6 envelope. ``content_hash`` (the DataVersion) ignores provenance fields."""

    step_id: str
    project_id: str
    episode_id: str
    status: str
    schema_version: int
    config_hash: str
    resume_config_keys: tuple[str, ...]
    config_fingerprints: Mapping[str, str]
    project_config_snapshot: Mapping[str, Any]
    data: Mapping[str, Any]
    artifacts: tuple[Artifact, ...] = ()
    produced_by: Mapping[str, Any] = field(default_factory=dict)
    created_at: str = ""
    mutations: tuple[Mapping[str, Any], ...] = ()

    @property
    def key(self) -> StepKey:
        return StepKey(self.project_id, self.episode_id, self.step_id)

    @property
    def run_id(self) -> str | None:
        value = self.produced_by.get("run_id")
        return str(value) if value is not None else None

    @property
    def version(self) -> str:
        """Which version of this step's envelope: a rewrite or an in-place mutation changes it."""
        return f"{self.created_at}|{self.run_id}|{len(self.mutations)}"

    @property
    def content_hash(self) -> str:
        """Hash of what downstream consumes: schema, status, data and artifact contents."""
        return sha256_text(
            canonical_json(
                {
                    "schema_version": self.schema_version,
                    "status": self.status,
                    "data": self.data,
                    "artifacts": [asdict(a) for a in self.artifacts],
                }
            )
        )

    @property
    def identity_hash(self) -> str:
        """Everything but provenance: equal identity means a rewrite would change nothing."""
        return sha256_text(
            canonical_json(
                {
                    "content": self.content_hash,
                    "config_hash": self.config_hash,
                    "config_fingerprints": dict(self.config_fingerprints),
                    "mutations": list(self.mutations),
                }
            )
        )

    def summary(self) -> CheckpointSummary:
        return CheckpointSummary(
            present=True,
            schema_version=self.schema_version,
            status=self.status,
            config_hash=self.config_hash,
            config_fingerprints=dict(self.config_fingerprints),
        )

    def artifact(self, path: str) -> Artifact | None:
        return next((a for a in self.artifacts if a.path == path), None)

    def with_changes(self, **changes: Any) -> "Checkpoint":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "project_id": self.project_id,
            "episode_id": self.episode_id,
            "status": self.status,
            "schema_version": self.schema_version,
            "config_hash": self.config_hash,
            "resume_config_keys": list(self.resume_config_keys),
            "config_fingerprints": dict(self.config_fingerprints),
            "project_config_snapshot": mask_secrets(self.project_config_snapshot),
            "data": self.data,
            "artifacts": [asdict(a) for a in self.artifacts],
            "produced_by": dict(self.produced_by),
            "created_at": self.created_at,
            "mutations": list(self.mutations),
            "content_hash": self.content_hash,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, raw: Any, *, source: str) -> "Checkpoint":
        """Parse an envelope, raising a typed integrity error that names ``source``."""

        def broken(problem: str) -> PipelineError:
            return PipelineError(
                "io.integrity_violation",
                f"checkpoint {source}: {problem}",
                origin=Origin.CONTRACT_DRIFT.value,
                details={"path": source},
            )

        if not isinstance(raw, Mapping):
            raise broken("envelope is not a JSON object")
        absent = [name for name in REQUIRED_FIELDS if name not in raw]
        if absent:
            raise broken(f"envelope is missing fields {absent}")
        if not isinstance(raw["schema_version"], int) or isinstance(raw["schema_version"], bool):
            raise broken(f"schema_version {raw['schema_version']!r} is not an integer")
        if not isinstance(raw["data"], Mapping):
            raise broken("data is not an object")
        try:
            artifacts = tuple(
                Artifact(path=str(a["path"]), sha256=str(a["sha256"]), bytes=int(a["bytes"]))
                for a in raw["artifacts"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise broken(f"malformed artifacts list ({exc})") from None
        checkpoint = cls(
            step_id=str(raw["step_id"]),
            project_id=str(raw["project_id"]),
            episode_id=str(raw["episode_id"]),
            status=str(raw["status"]),
            schema_version=raw["schema_version"],
            config_hash=str(raw["config_hash"]),
            resume_config_keys=tuple(raw["resume_config_keys"]),
            config_fingerprints=dict(raw.get("config_fingerprints") or {}),
            project_config_snapshot=dict(raw["project_config_snapshot"]),
            data=dict(raw["data"]),
            artifacts=artifacts,
            produced_by=dict(raw["produced_by"]),
            created_at=str(raw["created_at"]),
            mutations=tuple(dict(m) for m in raw["mutations"]),
        )
        stored = raw.get("content_hash")
        if stored is not None and stored != checkpoint.content_hash:
            raise PipelineError(
                "io.integrity_violation",
                f"checkpoint {source}: content hash {stored} does not match the content "
                f"({checkpoint.content_hash}); the file was edited outside the pipeline",
                origin=Origin.INVARIANT_DRIFT.value,
                details={"path": source},
            )
        return checkpoint
