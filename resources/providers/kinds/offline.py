"""``provider.kind: offline`` (the default): the deterministic models, no endpoint, no key.

Their latency comes from ``PIPELINE_OFFLINE_LATENCY_MS`` at each call, never at import.
"""

from pipeline_defs.project import ProviderConfig
from resources.providers.base import ImageModel, TextModel
from resources.providers.offline_images import OfflineImageModel
from resources.providers.offline_text import OfflineTextModel


def text_model(config: ProviderConfig) -> TextModel:
    """The offline text model (the project's model names are the offline ones)."""
    return OfflineTextModel()


def image_model(config: ProviderConfig) -> ImageModel:
    """The offline image model."""
    return OfflineImageModel()
