"""Which text and image models the steps call.

The code location's default is the offline deterministic pair. A project whose
``provider.kind`` is ``openai`` gets OpenAI-compatible models from
:func:`provider_models`; run it by passing them as the ``text_model`` / ``image_model``
resources (``build_resources`` + overrides). The API key comes from the environment
variable ``PIPELINE_PROVIDER_API_KEY`` (resolved at call time, never stored in config),
else from the yaml ``api_key``.
"""

import os

import dagster as dg

from pipeline_defs.project import ProviderConfig
from pipeline_defs.resume.errors import PipelineError
from resources.providers import (
    ImageModel,
    OfflineImageModel,
    OfflineTextModel,
    OpenAIImageModel,
    OpenAITextModel,
    TextModel,
)
from resources.providers.base import simulated_latency_ms

API_KEY_ENV = "PIPELINE_PROVIDER_API_KEY"


def offline_latency_ms() -> int:
    """``PIPELINE_OFFLINE_LATENCY_MS`` read now (not at import); invalid values refuse."""
    return simulated_latency_ms(None)


def default_text_model() -> TextModel:
    """Offline text model; its latency comes from the environment at each call."""
    return OfflineTextModel()


def default_image_model() -> ImageModel:
    """Offline image model; its latency comes from the environment at each call."""
    return OfflineImageModel()


def provider_models(config: ProviderConfig) -> tuple[TextModel, ImageModel]:
    """The (text, image) models a project's ``provider:`` section asks for."""
    if config.kind == "offline":
        return default_text_model(), default_image_model()
    if not config.base_url:
        raise PipelineError(
            "config.invalid", "provider.kind is openai but provider.base_url is not set"
        )
    api_key: str | dg.EnvVar | None = (
        dg.EnvVar(API_KEY_ENV) if os.environ.get(API_KEY_ENV) else config.api_key
    )
    return (
        OpenAITextModel(
            base_url=config.base_url,
            model=config.text_model,
            api_key=api_key,  # type: ignore[arg-type]  # an EnvVar resolves at run time
            timeout_seconds=config.timeout_seconds,
        ),
        OpenAIImageModel(
            base_url=config.base_url,
            model=config.image_model,
            api_key=api_key,  # type: ignore[arg-type]
            timeout_seconds=config.timeout_seconds,
        ),
    )
