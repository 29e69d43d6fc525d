"""Per-project configuration: ``$PIPELINE_HOME/projects/<p>/project.yaml``, validated.

Unknown keys are rejected by name. A step's config hash covers only the dotted keys it
lists in ``resume_config_keys``, so editing anything else never blocks or re-runs it.
"""

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline_defs.resume.decision import fingerprint
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import validate_id

ABSENT = "<absent>"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderConfig(_Strict):
    """Which model endpoints the project uses. Prefer the API key from the environment."""

    kind: Literal["offline", "openai"] = "offline"
    base_url: str | None = None
    text_model: str = "offline-text-v1"
    image_model: str = "offline-image-v1"
    api_key: str | None = None
    timeout_seconds: float = Field(default=60, gt=0)


class ImageSize(_Strict):
    width: int = Field(default=384, ge=64, le=4096)
    height: int = Field(default=256, ge=64, le=4096)


class StoryKnobs(_Strict):
    max_bytes: int = Field(default=1 << 20, gt=0)
    segment_chars: int = Field(default=600, ge=50)


class EntityKnobs(_Strict):
    max_characters: int = Field(default=6, ge=1, le=99)
    min_mentions: int = Field(default=2, ge=1)


class SceneKnobs(_Strict):
    shots_per_scene: int = Field(default=2, ge=1, le=12)
    variations_per_shot: int = Field(default=1, ge=1, le=4)
    camera_style: str = "cinematic 35mm framing"


class ReviewKnobs(_Strict):
    required_keywords: tuple[str, ...] = ()
    enabled: bool = True


class ImageKnobs(_Strict):
    ref_min_mentions: int = Field(default=2, ge=1)


class ProjectConfig(_Strict):
    """The whole project file. Every section has defaults; unknown keys are refused."""

    title: str = "Untitled project"
    style: str = "ink storyboard"
    image: ImageSize = ImageSize()
    story: StoryKnobs = StoryKnobs()
    entities: EntityKnobs = EntityKnobs()
    scenes: SceneKnobs = SceneKnobs()
    review: ReviewKnobs = ReviewKnobs()
    images: ImageKnobs = ImageKnobs()
    provider: ProviderConfig = ProviderConfig()

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def project_dir(home: Path, project_id: str) -> Path:
    return Path(home) / "projects" / validate_id(project_id, "project_id")


def project_config_path(home: Path, project_id: str) -> Path:
    return project_dir(home, project_id) / "project.yaml"


def parse_project_config(raw: Any, *, source: str) -> ProjectConfig:
    """Validate a loaded YAML document, naming the file and the offending key."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise PipelineError("config.invalid", f"{source}: the project file must be a mapping")
    try:
        return ProjectConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        problem = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        raise PipelineError(
            "config.invalid",
            f"{source}: {where}: {problem}",
            details={"path": source, "key": where},
        ) from None


_CACHE: dict[Path, tuple[tuple[int, int, int], ProjectConfig]] = {}


def load_project_config(home: Path, project_id: str) -> ProjectConfig:
    """The project's config; defaults when the file does not exist yet.

    Parsed once per file identity (mtime, size, inode): the sensor judges every step of
    every episode each tick and must not re-parse YAML thousands of times.
    """
    path = project_config_path(home, project_id)
    try:
        stat = path.stat()
    except FileNotFoundError:
        return ProjectConfig()
    identity = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
    cached = _CACHE.get(path)
    if cached is not None and cached[0] == identity:
        return cached[1]
    config = _read_project_config(path)
    _CACHE[path] = (identity, config)
    return config


def _read_project_config(path: Path) -> ProjectConfig:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise PipelineError(
            "config.invalid", f"{path}: not valid YAML ({exc})", details={"path": str(path)}
        ) from None
    return parse_project_config(raw, source=str(path))


def lookup(config: dict[str, Any], dotted: str) -> Any:
    """Value at a dotted path, or ABSENT."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return ABSENT
        node = node[part]
    return node


def scoped_fingerprints(config: dict[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    """Fingerprint of each listed key's value: what a step's config hash is made of."""
    return {key: fingerprint(lookup(config, key)) for key in keys}
