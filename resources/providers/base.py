"""Provider contracts: every model call in the pipeline goes through one of these resources.

Steps depend only on ``TextModel`` / ``ImageModel`` so the offline generator and an
OpenAI-compatible endpoint are interchangeable, and every call yields ``units`` the ledger
can count (docs/DESIGN.md#reference-pipeline).
"""

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import dagster as dg

from pipeline_defs.project import IMAGE_MODEL_KEYS, TEXT_MODEL_KEYS
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.money import Usage
from pipeline_defs.resume.settings_registry import SETTINGS, read

if TYPE_CHECKING:
    from pipeline_defs.project import ProviderConfig

# Stable error codes of the provider layer (members of the one ErrorCode enum, which also
# carries their statuses: upstream failures are "bad gateway"/"unavailable", not a 400).
HTTP_ERROR = ErrorCode.PROVIDER_HTTP_ERROR
RETRIES_EXHAUSTED = ErrorCode.PROVIDER_RETRIES_EXHAUSTED
BAD_RESPONSE = ErrorCode.PROVIDER_BAD_RESPONSE
CONFIG_ERROR = ErrorCode.PROVIDER_CONFIG
NO_KEY = ErrorCode.PROVIDER_NO_KEY
INVALID_INPUT = ErrorCode.INPUT_INVALID

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Largest edge we accept: guards Pillow and remote endpoints against absurd requests.
MAX_IMAGE_EDGE = 4096


def provider_error(
    code: ErrorCode, message: str, *, details: Mapping[str, Any] | None = None
) -> PipelineError:
    """A ``PipelineError`` of a provider code (its status comes with the code)."""
    return PipelineError(code, message, details=details)


@dataclass(frozen=True)
class TextCall:
    """One structured text request; ``task`` names the step's request kind (e.g. entity_canon)."""

    task: str
    prompt: str
    payload: Mapping[str, Any]
    # The most output tokens the model may answer with (sent as ``max_completion_tokens``);
    # set by the provider meter under a money budget, the worst case it reserves.
    max_output_tokens: int | None = None


@dataclass(frozen=True)
class TextReply:
    """The parsed JSON object a model answered, with billable ``units`` (tokens, or 1 offline)
    and its ``usage`` as the endpoint reported it (None: it reported none)."""

    data: dict[str, Any]
    units: int
    model: str
    usage: Usage | None = None


@dataclass(frozen=True)
class ImageCall:
    """One image request; ``seed`` makes offline output reproducible per content hash."""

    prompt: str
    caption: str
    width: int
    height: int
    seed: str


@dataclass(frozen=True)
class ImageReply:
    """PNG bytes of one generated image, with billable ``units`` and its ``usage``."""

    png: bytes
    units: int
    model: str
    usage: Usage | None = None


def check_image_size(call: ImageCall) -> None:
    """Reject sizes no provider can honour before spending a call (or memory) on them."""
    for name, value in (("width", call.width), ("height", call.height)):
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or not 1 <= value <= MAX_IMAGE_EDGE
        ):
            raise provider_error(
                INVALID_INPUT,
                f"image {name} must be an integer in 1..{MAX_IMAGE_EDGE}, got {value!r}",
                details={name: repr(value)},
            )


class TextModel(dg.ConfigurableResource["TextModel"]):
    """A text model answering one JSON object per call; steps depend on this, not on a vendor."""

    def for_provider(self, provider: "ProviderConfig") -> "TextModel":
        """The model that answers for a project with this ``provider:`` section.

        Itself by default (a model passed in explicitly, e.g. a test's fake, answers for
        every project); the shipped resource routes per project instead.
        """
        return self

    def preflight(self) -> None:
        """Raise a typed error now if a call could not even be sent (config, key)."""

    def complete(self, call: TextCall) -> TextReply:
        """Answer ``call`` with a parsed JSON object; subclasses implement the transport."""
        raise NotImplementedError(f"{type(self).__name__} does not implement complete()")

    @property
    def model_name(self) -> str:
        """Model name recorded in the ledger and checkpoint metadata."""
        raise NotImplementedError(f"{type(self).__name__} does not implement model_name")


class ImageModel(dg.ConfigurableResource["ImageModel"]):
    """An image model returning PNG bytes; steps depend on this, not on a vendor."""

    def for_provider(self, provider: "ProviderConfig") -> "ImageModel":
        """The model that answers for a project with this ``provider:`` section (see
        ``TextModel.for_provider``)."""
        return self

    def preflight(self) -> None:
        """Raise a typed error now if a call could not even be sent (config, key)."""

    def generate(self, call: ImageCall) -> ImageReply:
        """Produce one PNG for ``call``; subclasses implement the transport or drawing."""
        raise NotImplementedError(f"{type(self).__name__} does not implement generate()")

    @property
    def model_name(self) -> str:
        """Model name recorded in the ledger and checkpoint metadata."""
        raise NotImplementedError(f"{type(self).__name__} does not implement model_name")


class Model(Protocol):
    """What the run protocol asks of a model of any kind: route, check, name."""

    def for_provider(self, provider: "ProviderConfig") -> Any: ...

    def preflight(self) -> None: ...

    @property
    def model_name(self) -> str: ...


class Reply(Protocol):
    """What the cost ledger records of any reply."""

    @property
    def units(self) -> int: ...

    @property
    def model(self) -> str: ...


CallT = TypeVar("CallT")
ReplyT = TypeVar("ReplyT", bound=Reply)


@dataclass(frozen=True)
class ModelKind(Generic[CallT, ReplyT]):
    """One kind of model the steps call: what the run protocol, the meter, the wiring and
    the cost ledger need to know of it. A new kind is its contract here (a model resource,
    its call and reply, an entry in :data:`MODEL_KINDS`), an offline model, its config key
    (``pipeline_defs/project.py``) and the code location's router for it
    (``pipeline_defs/storyboard/providers.py``): everything else iterates the kinds."""

    name: str  # the cost ledger's word for a call of this kind (``provider_call.kind``)
    resource_key: str  # the code location's Dagster resource for it
    config_keys: tuple[str, ...]  # what a step calling it lists in ``resume_config_keys``
    ask: Callable[[Any, CallT], ReplyT]  # how a model of this kind answers one call
    # How the journal of paid replies keeps a reply as bytes, and revives it from them
    # (bytes, units, model): a reply taken back is the reply that was paid for.
    keep: Callable[[ReplyT], bytes]
    revive: Callable[[bytes, int, str], ReplyT]

    def called_by(self, resume_config_keys: tuple[str, ...]) -> bool:
        """Whether a step calls this kind, as its ``resume_config_keys`` declare it."""
        return self.config_keys[-1] in resume_config_keys


def _complete(model: TextModel, call: TextCall) -> TextReply:
    return model.complete(call)


def _generate(model: ImageModel, call: ImageCall) -> ImageReply:
    return model.generate(call)


def _keep_text(reply: TextReply) -> bytes:
    return json.dumps(reply.data, sort_keys=True, ensure_ascii=False).encode("utf-8")


def _revive_text(payload: bytes, units: int, model: str) -> TextReply:
    return TextReply(json.loads(payload), units, model)


def _keep_image(reply: ImageReply) -> bytes:
    return reply.png


def _revive_image(payload: bytes, units: int, model: str) -> ImageReply:
    return ImageReply(payload, units, model)


TEXT: ModelKind[TextCall, TextReply] = ModelKind(
    "text", "text_model", TEXT_MODEL_KEYS, _complete, _keep_text, _revive_text
)
IMAGE: ModelKind[ImageCall, ImageReply] = ModelKind(
    "image", "image_model", IMAGE_MODEL_KEYS, _generate, _keep_image, _revive_image
)
# Every kind of model the steps may call, by ``name``.
MODEL_KINDS: tuple[ModelKind[Any, Any], ...] = (TEXT, IMAGE)


LATENCY_ENV = SETTINGS["offline_latency_ms"].var


def simulated_latency_ms(configured: int | None) -> int:
    """Offline models' simulated latency: the configured value, else the environment.

    Read per call, never when the code location is imported; an invalid value refuses.
    """
    if configured is not None:
        return configured
    raw = read(LATENCY_ENV).strip()
    if not raw:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise PipelineError(
            ErrorCode.SETTINGS_INVALID, f"{LATENCY_ENV} must be a non-negative integer, got {raw!r}"
        )
    return value
