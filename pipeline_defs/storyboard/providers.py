"""Which text and image models the steps call: the ones the project's ``provider:`` asks for.

The code location ships :class:`ProjectTextModel` / :class:`ProjectImageModel` as its
``text_model`` / ``image_model`` resources. They hold no configuration of their own: the
run protocol asks them, per step run, for the model of the step's project
(``for_provider(project.provider)``), so UI launches, the sensor, backfills and the CLI all
get what ``projects/<p>/project.yaml`` says, with no resource override. ``offline`` (the
default) is the deterministic pair; ``openai`` is any OpenAI-compatible endpoint, its key
read at each request from the environment variable ``provider.api_key_env`` (default
``PIPELINE_PROVIDER_API_KEY``). A model passed in explicitly (a test's fake) answers for
every project, as before. Each kind's models are made by its module in
``resources/providers/kinds/`` (the registry: :mod:`resources.providers.provider_kinds`).
"""

from pipeline_defs.project import ProviderConfig
from pipeline_defs.resume.errors import PipelineError
from resources.providers import (
    CONFIG_ERROR,
    ImageCall,
    ImageModel,
    ImageReply,
    OfflineImageModel,
    OfflineTextModel,
    TextCall,
    TextModel,
    TextReply,
)
from resources.providers.base import IMAGE, TEXT, provider_error, simulated_latency_ms
from resources.providers.provider_kinds import image_model_for, text_model_for

PER_PROJECT = "per-project"


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
    return text_model_for(config), image_model_for(config)


def _unrouted(kind: str) -> PipelineError:
    # Calling the router itself would silently pick a provider for no project.
    return provider_error(
        CONFIG_ERROR,
        f"the per-project {kind} model must be resolved for a project (for_provider) first",
    )


def model_routers() -> dict[str, TextModel | ImageModel]:
    """The code location's model resources by kind name (``MODEL_KINDS``): each answers
    for a project with the model its ``provider:`` section asks for."""
    return {TEXT.name: ProjectTextModel(), IMAGE.name: ProjectImageModel()}


class ProjectTextModel(TextModel):
    """The shipped ``text_model`` resource: each project's own text model."""

    def for_provider(self, provider: ProviderConfig) -> TextModel:
        return text_model_for(provider)

    def complete(self, call: TextCall) -> TextReply:
        raise _unrouted("text")

    @property
    def model_name(self) -> str:
        return PER_PROJECT


class ProjectImageModel(ImageModel):
    """The shipped ``image_model`` resource: each project's own image model."""

    def for_provider(self, provider: ProviderConfig) -> ImageModel:
        return image_model_for(provider)

    def generate(self, call: ImageCall) -> ImageReply:
        raise _unrouted("image")

    @property
    def model_name(self) -> str:
        return PER_PROJECT
