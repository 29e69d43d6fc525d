"""Per-project configuration: ``$PIPELINE_HOME/projects/<p>/project.yaml``, validated.

Unknown keys are rejected by name. A step's config hash covers only the dotted keys it
lists in ``resume_config_keys``, so editing anything else never blocks or re-runs it.
"""

import os
import stat as stat_module
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipeline_defs.resume.decision_types import fingerprint
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.files import read_nofollow, symlink_error
from pipeline_defs.resume.layout import DataLayout, stat_identity
from pipeline_defs.resume.money import MoneyBudget, Price, to_micros
from pipeline_defs.resume.partition import validate_id
from pipeline_defs.resume.settings import MAX_CALLS_PER_EPISODE
from pipeline_defs.resume.settings_registry import SETTINGS

ABSENT = "<absent>"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


DEFAULT_API_KEY_ENV = SETTINGS["provider_api_key"].var


# Upper bounds of the numeric knobs. Without them a typo'd exponent validated
# and broke later, far from the file: ``story.max_bytes: 1e29`` written out in full made
# ``add-episode`` read ``max_bytes + 1`` bytes (OverflowError past 2**63), and other knobs
# took values no story can mean. Each bound is far above any sane setting.
MAX_PROVIDER_TIMEOUT_SECONDS = 3600
# A story is read whole into memory, kept in the story_source checkpoint and quoted in
# prompts: 64 MiB is some fifty novels.
MAX_STORY_BYTES = 64 << 20
# A segment is a slice of the story sent in one prompt; no model reads a million
# characters at once, and a larger value means no more than "one segment per scene".
MAX_SEGMENT_CHARS = 1_000_000
# A mention threshold: a name said a million times in one story is no threshold anyone
# means (the largest story allowed holds about ten million words).
MAX_MENTIONS = 1_000_000


# The kinds of endpoint a project's ``provider.kind`` may name: the one list. Each is a
# module ``resources/providers/kinds/<kind>.py`` making its models, found by this name
# (``resources/providers/provider_kinds.py``); a new kind is its module and its name here.
PROVIDER_KINDS: tuple[str, ...] = ("offline", "openai")


# Bounds of the rate limit's settings: far above any endpoint's, refusing only nonsense.
MAX_REQUESTS_PER_MINUTE = 1_000_000
MAX_TOKENS_PER_MINUTE = 1_000_000_000


class ProviderConfig(_Strict):
    """Which model endpoints the project's steps call, decided per project at run time.

    The API key comes from the environment variable ``api_key_env``. A literal ``api_key``
    is accepted as a fallback; it is never written as it is: checkpoint snapshots mask it
    (``mask_secrets``), ``repr`` hides it, the provider errors scrub it.
    """

    kind: str = "offline"  # one of PROVIDER_KINDS
    base_url: str | None = None
    text_model: str = "offline-text-v1"
    image_model: str = "offline-image-v1"
    api_key_env: str = Field(default=DEFAULT_API_KEY_ENV, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    api_key: str | None = Field(default=None, repr=False)
    # Per attempt. An hour is far beyond any endpoint's answer time; without a bound
    # ``.inf`` or ``1e300`` validated and left a worker waiting on a dead connection for good.
    timeout_seconds: float = Field(
        default=60, gt=0, le=MAX_PROVIDER_TIMEOUT_SECONDS, allow_inf_nan=False
    )
    # One rate limit per base_url and model, shared by every process on the ledger
    # (docs/DESIGN.md#rate-limit); None: no limit of ours (a 429's Retry-After still pauses).
    requests_per_minute: int | None = Field(default=None, ge=1, le=MAX_REQUESTS_PER_MINUTE)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=MAX_TOKENS_PER_MINUTE)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in PROVIDER_KINDS:
            raise ValueError(f"{kind!r} is not one of {', '.join(PROVIDER_KINDS)}")
        return kind


# What a step calling the text / image model lists in ``resume_config_keys``: switching the
# provider or that model is a scoped config change for it, and for no other step.
TEXT_MODEL_KEYS: tuple[str, ...] = ("provider.kind", "provider.base_url", "provider.text_model")
IMAGE_MODEL_KEYS: tuple[str, ...] = ("provider.kind", "provider.base_url", "provider.image_model")


class ImageSize(_Strict):
    width: int = Field(default=384, ge=64, le=4096)
    height: int = Field(default=256, ge=64, le=4096)


class StoryKnobs(_Strict):
    max_bytes: int = Field(default=1 << 20, gt=0, le=MAX_STORY_BYTES)
    segment_chars: int = Field(default=600, ge=50, le=MAX_SEGMENT_CHARS)


class EntityKnobs(_Strict):
    max_characters: int = Field(default=6, ge=1, le=99)
    min_mentions: int = Field(default=2, ge=1, le=MAX_MENTIONS)


class SceneKnobs(_Strict):
    shots_per_scene: int = Field(default=2, ge=1, le=12)
    variations_per_shot: int = Field(default=1, ge=1, le=4)
    camera_style: str = "cinematic 35mm framing"


class ReviewKnobs(_Strict):
    required_keywords: tuple[str, ...] = ()
    enabled: bool = True


class ImageKnobs(_Strict):
    ref_min_mentions: int = Field(default=2, ge=1, le=MAX_MENTIONS)


# A money budget's bound: far above any sane budget, and it keeps micro-units in 64 bits.
MAX_COST = Decimal(1_000_000_000)
# Output tokens a text call is sent with (``max_tokens``) under a money budget: the worst
# case a call reserves (docs/DESIGN.md#money-budgets).
DEFAULT_MAX_OUTPUT_TOKENS = 4096


class BudgetKnobs(_Strict):
    # The project's own spend cap (docs/DESIGN.md#spend-cap); unset, the setting
    # max_calls_per_episode applies.
    max_calls_per_episode: int | None = Field(default=None, ge=1, le=MAX_CALLS_PER_EPISODE)
    # Budgets in money (docs/DESIGN.md#money-budgets), in the currency of ``pricing:``.
    max_cost_per_episode: Decimal | None = Field(default=None, gt=0, le=MAX_COST)
    max_cost_per_project_per_day: Decimal | None = Field(default=None, gt=0, le=MAX_COST)
    max_output_tokens: int = Field(default=DEFAULT_MAX_OUTPUT_TOKENS, ge=1, le=1_000_000)


class ModelPrice(_Strict):
    """One model's price: text per 1M input, output (and cached input) tokens; images per
    image by size (``"1024x1024"``, or ``"*"`` for any size)."""

    input_per_1m: Decimal | None = Field(default=None, ge=0, le=MAX_COST)
    output_per_1m: Decimal | None = Field(default=None, ge=0, le=MAX_COST)
    cached_input_per_1m: Decimal | None = Field(default=None, ge=0, le=MAX_COST)
    per_image: dict[str, Decimal] = Field(default_factory=dict)


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
    budget: BudgetKnobs = BudgetKnobs()
    # Prices by model name (docs/DESIGN.md#money-budgets); the offline models are free.
    pricing: dict[str, ModelPrice] = Field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def project_dir(home: Path, project_id: str) -> Path:
    return Path(DataLayout.of(home).project_dir(validate_id(project_id, "project_id")))


def project_config_path(home: Path, project_id: str) -> Path:
    return Path(DataLayout.of(home).project_file(validate_id(project_id, "project_id")))


def refuse_input_links(home: Path, path: Path) -> None:
    """``checkpoint.symlink`` naming the first component of ``path`` below ``home`` that is
    a symbolic link (docs/DESIGN.md#no-escape: nothing is read through a link out of the home).

    Inputs get the checkpoint tree's code on purpose: one stable code for "a link where a
    file or directory of the pipeline should be", which the judge turns into a block
    (contract drift) wherever it is found. Any link is refused, even one pointing inside
    the home: where it points can change after the check. The home itself may be a link.
    Components that do not exist end the check (nothing below them can be followed).
    """
    current = Path(home)
    for part in Path(path).relative_to(current).parts:  # lexical: never resolved
        current = current / part
        try:
            found = os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):
            return
        if stat_module.S_ISLNK(found.st_mode):
            raise symlink_error(current, "an input file or directory")


def refuse_project_links(home: Path, project_id: str) -> Path:
    """No link from the home down to ``project.yaml`` or to the project's ``episodes/``
    directory (the roots of every input of the project); the project file's path."""
    episodes = DataLayout.of(home).episodes_dir(validate_id(project_id, "project_id"))
    refuse_input_links(home, Path(episodes))
    path = project_config_path(home, project_id)
    refuse_input_links(home, path)
    return path


def parse_project_config(raw: Any, *, source: str) -> ProjectConfig:
    """Validate a loaded YAML document, naming the file and the offending key."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise PipelineError(
            ErrorCode.CONFIG_INVALID, f"{source}: the project file must be a mapping"
        )
    try:
        config = ProjectConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        problem = "unknown key" if first["type"] == "extra_forbidden" else first["msg"]
        raise PipelineError(
            ErrorCode.CONFIG_INVALID,
            f"{source}: {where}: {problem}",
            details={"path": source, "key": where},
        ) from None
    refuse_unpriced(config, source=source)
    return config


# Models that cost nothing unless the project prices them: the offline ones.
FREE_MODELS = (ProviderConfig().text_model, ProviderConfig().image_model)


def _image_size(config: ProjectConfig) -> str:
    return f"{config.image.width}x{config.image.height}"


def model_prices(config: ProjectConfig) -> dict[str, Price]:
    """Every priced model of the project by name: its ``pricing:`` entry (a text price
    needs both token prices; an image price, one for the project's image size or ``*``),
    and the offline models at 0 unless priced."""
    prices = {name: Price(name) for name in FREE_MODELS}
    size = _image_size(config)
    for name, entry in config.pricing.items():
        image = entry.per_image.get(size, entry.per_image.get("*"))
        text = entry.input_per_1m is not None and entry.output_per_1m is not None
        if not text and image is None:
            prices.pop(name, None)
            continue
        prices[name] = Price(
            name,
            input_per_1m=entry.input_per_1m or Decimal(0),
            output_per_1m=entry.output_per_1m or Decimal(0),
            cached_input_per_1m=entry.cached_input_per_1m,
            per_image=image or Decimal(0),
        )
    return prices


def unpriced_models(config: ProjectConfig) -> list[tuple[str, str]]:
    """The project's models a money budget could not price: (model, the key naming it)."""
    text, image = config.provider.text_model, config.provider.image_model
    missing: list[tuple[str, str]] = []
    entry = config.pricing.get(text)
    if text not in FREE_MODELS and (
        entry is None or entry.input_per_1m is None or entry.output_per_1m is None
    ):
        missing.append((text, "provider.text_model"))
    entry = config.pricing.get(image)
    size = _image_size(config)
    if image not in FREE_MODELS and (
        entry is None or (size not in entry.per_image and "*" not in entry.per_image)
    ):
        missing.append((image, "provider.image_model"))
    return missing


def refuse_unpriced(config: ProjectConfig, *, source: str) -> None:
    """``config.unpriced_model`` naming each model a money budget of the project cannot
    price: a budget in money holds only if every call has a price before it is sent."""
    budget = config.budget
    if budget.max_cost_per_episode is None and budget.max_cost_per_project_per_day is None:
        return
    missing = unpriced_models(config)
    if not missing:
        return
    named = "; ".join(
        f"{model!r} ({key}): add pricing.{model}."
        + (
            "input_per_1m and output_per_1m"
            if key.endswith("text_model")
            else f"per_image.{_image_size(config)} (or per_image.*)"
        )
        for model, key in missing
    )
    raise PipelineError(
        ErrorCode.CONFIG_UNPRICED_MODEL,
        f"{source}: a money budget is set (budget.max_cost_per_episode or "
        f"budget.max_cost_per_project_per_day) but a model has no price: {named}",
        details={"path": source, "models": [model for model, _ in missing]},
    )


def money_budget(config: ProjectConfig, project_file: str) -> MoneyBudget:
    """The project's money budgets and prices, as the provider meter applies them."""
    budget = config.budget
    return MoneyBudget(
        per_episode=None
        if budget.max_cost_per_episode is None
        else to_micros(budget.max_cost_per_episode),
        per_project_day=None
        if budget.max_cost_per_project_per_day is None
        else to_micros(budget.max_cost_per_project_per_day),
        prices=model_prices(config),
        max_output_tokens=budget.max_output_tokens,
        project_file=project_file,
    )


_CACHE: dict[Path, tuple[tuple[int, int, int], ProjectConfig]] = {}


def load_project_config(home: Path, project_id: str) -> ProjectConfig:
    """The project's config; defaults when the file does not exist yet.

    Parsed once per file identity (mtime, size, inode): the sensor judges every step of
    every episode each tick and must not re-parse YAML thousands of times. A link on the
    way is refused (:func:`refuse_project_links`), even when the parse is cached.
    """
    path = refuse_project_links(home, project_id)
    try:
        stat = os.lstat(path)
    except FileNotFoundError:
        return ProjectConfig()
    identity = stat_identity(stat)
    cached = _CACHE.get(path)
    if cached is not None and cached[0] == identity:
        return cached[1]
    config = _read_project_config(path)
    _CACHE[path] = (identity, config)
    return config


def _yaml_problem(path: Path, exc: yaml.YAMLError) -> str:
    """Where the file is broken and how, on one line: ``<path>, line L, column C: not valid
    YAML: <problem> (<context>)`` (PyYAML's own text spans several lines and names the
    string it parsed, not the file)."""
    mark = getattr(exc, "problem_mark", None)
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = " ".join((f"{problem} ({context})" if context else str(problem)).split())
    return f"{path}{where}: not valid YAML: {detail}"


def _read_project_config(path: Path) -> ProjectConfig:
    try:
        raw = yaml.safe_load(read_nofollow(path).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PipelineError(
            ErrorCode.CONFIG_INVALID,
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})",
            details={"path": str(path)},
        ) from None
    except yaml.YAMLError as exc:
        raise PipelineError(
            ErrorCode.CONFIG_INVALID, _yaml_problem(path, exc), details={"path": str(path)}
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


_PROVIDER_DEFAULTS = ProviderConfig().model_dump(mode="json")


def _defaulted_provider_key(config: dict[str, Any], key: str) -> bool:
    """A ``provider.*`` key still at its offline default.

    Left out of the fingerprints: checkpoints written before the provider keys were scoped
    keep their hash (an upgrade blocks nothing), while any switch away from the default,
    and back, is still a change that names the key.
    """
    section, _, name = key.partition(".")
    if section != "provider" or name not in _PROVIDER_DEFAULTS:
        return False
    return lookup(config, key) in (ABSENT, _PROVIDER_DEFAULTS[name])


def scoped_fingerprints(config: dict[str, Any], keys: tuple[str, ...]) -> dict[str, str]:
    """Fingerprint of each listed key's value: what a step's config hash is made of."""
    return {
        key: fingerprint(lookup(config, key))
        for key in keys
        if not _defaulted_provider_key(config, key)
    }
