"""Model providers: every text and image call of the pipeline goes through these resources."""

from .base import (
    BAD_RESPONSE,
    CONFIG_ERROR,
    HTTP_ERROR,
    NO_KEY,
    PNG_SIGNATURE,
    RETRIES_EXHAUSTED,
    ImageCall,
    ImageModel,
    ImageReply,
    TextCall,
    TextModel,
    TextReply,
)
from .offline_images import OFFLINE_IMAGE_MODEL, OfflineImageModel
from .offline_text import OFFLINE_TEXT_MODEL, OfflineTextModel
from .openai_http import OpenAIConnection, OpenAIImageModel, OpenAITextModel

__all__ = [
    "BAD_RESPONSE",
    "CONFIG_ERROR",
    "HTTP_ERROR",
    "NO_KEY",
    "OFFLINE_IMAGE_MODEL",
    "OFFLINE_TEXT_MODEL",
    "PNG_SIGNATURE",
    "RETRIES_EXHAUSTED",
    "ImageCall",
    "ImageModel",
    "ImageReply",
    "OfflineImageModel",
    "OfflineTextModel",
    "OpenAIConnection",
    "OpenAIImageModel",
    "OpenAITextModel",
    "TextCall",
    "TextModel",
    "TextReply",
]
