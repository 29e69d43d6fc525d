"""``provider.kind: openai``: any OpenAI-compatible endpoint at ``provider.base_url``.

The key is read at each request from the variable ``provider.api_key_env`` (or the literal
``provider.api_key``); see :mod:`resources.providers.openai_http`.
"""

from pipeline_defs.project import ProviderConfig
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.providers.base import ImageModel, TextModel
from resources.providers.openai_http import OpenAIImageModel, OpenAITextModel


def _base_url(config: ProviderConfig) -> str:
    if not config.base_url:
        raise PipelineError(
            ErrorCode.CONFIG_INVALID, "provider.kind is openai but provider.base_url is not set"
        )
    return config.base_url


def text_model(config: ProviderConfig) -> TextModel:
    """The endpoint's ``provider.text_model``."""
    return OpenAITextModel(
        base_url=_base_url(config),
        model=config.text_model,
        api_key_env=config.api_key_env,
        api_key=config.api_key,
        timeout_seconds=config.timeout_seconds,
    )


def image_model(config: ProviderConfig) -> ImageModel:
    """The endpoint's ``provider.image_model``."""
    return OpenAIImageModel(
        base_url=_base_url(config),
        model=config.image_model,
        api_key_env=config.api_key_env,
        api_key=config.api_key,
        timeout_seconds=config.timeout_seconds,
    )
