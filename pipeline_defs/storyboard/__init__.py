"""The reference pipeline (docs/DESIGN.md#reference-pipeline): ten judged steps, their providers.

Steps are listed in dependency order; each lives in a module named after it. Every model
call goes through ``ctx.providers`` (metered into the ledger); the default models are
the offline deterministic ones, see :mod:`pipeline_defs.storyboard.providers`.
"""

from pathlib import Path

from pipeline_defs.steps.spec import Step
from pipeline_defs.storyboard.composite_image_gen import CompositeImageGen
from pipeline_defs.storyboard.entity_canon import EntityCanon
from pipeline_defs.storyboard.entity_t2i import EntityT2I
from pipeline_defs.storyboard.providers import (
    ProjectImageModel,
    ProjectTextModel,
    default_image_model,
    default_text_model,
    provider_models,
)
from pipeline_defs.storyboard.ref_image_gen import RefImageGen
from pipeline_defs.storyboard.scene_detail import SceneDetail
from pipeline_defs.storyboard.scene_image_pipeline import SceneImagePipeline
from pipeline_defs.storyboard.shot_dependency_t2i import ShotDependencyT2I
from pipeline_defs.storyboard.story_source import StorySource
from pipeline_defs.storyboard.t2i_review import T2IReview
from pipeline_defs.storyboard.world_guide import WorldGuide

STORYBOARD_STEPS: tuple[Step, ...] = (
    StorySource(),
    EntityCanon(),
    WorldGuide(),
    SceneDetail(),
    EntityT2I(),
    ShotDependencyT2I(),
    T2IReview(),
    RefImageGen(),
    CompositeImageGen(),
    SceneImagePipeline(),
)

SAMPLES_DIR = Path(__file__).parent / "samples"


def sample_stories() -> dict[str, Path]:
    """Bundled sample stories by episode id (``ep01``, ``ep02``), for the demo."""
    return {
        "ep01": SAMPLES_DIR / "lantern_keeper.md",
        "ep02": SAMPLES_DIR / "clockwork_fair.md",
    }


__all__ = [
    "SAMPLES_DIR",
    "STORYBOARD_STEPS",
    "ProjectImageModel",
    "ProjectTextModel",
    "default_image_model",
    "default_text_model",
    "provider_models",
    "sample_stories",
]
