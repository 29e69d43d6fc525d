"""PLACEHOLDER — replaced by the reference pipeline (issue 4)."""

from pipeline_defs.steps.spec import Step
from resources.providers import ImageModel, OfflineImageModel, TextModel

STORYBOARD_STEPS: tuple[Step, ...] = ()


def default_text_model() -> TextModel:
    return TextModel()


def default_image_model() -> ImageModel:
    return OfflineImageModel()
