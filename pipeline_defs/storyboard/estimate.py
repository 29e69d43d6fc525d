"""How many provider calls a story will cost the reference storyboard, before it runs.

``storyboard add-episode`` prints it and refuses a story whose estimate is over the
episode's spend cap (docs/DESIGN.md#spend-cap). The estimate follows the steps:

- one text call each for ``entity_canon``, ``world_guide``, ``entity_t2i`` and
  ``shot_dependency_t2i``; one for ``t2i_review`` when the review is enabled;
- one text call per scene for ``scene_detail``;
- one picture per shot variation for ``scene_image_pipeline``: scenes x
  ``scenes.shots_per_scene`` x ``scenes.variations_per_shot``;
- per character (at most ``entities.max_characters``: the cast is the model's to find),
  one reference sheet and, assumed, ``OUTLOOKS_PER_CHARACTER`` composites of its other
  outlooks.

The demo's two episodes are estimated at 35 calls each and record 24 and 26. An estimate,
not a promise: the cap itself is enforced call by call when they are sent.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline_defs.project import ProjectConfig

# Text steps with one call per episode (the review is counted apart: it can be disabled).
SINGLE_CALL_STEPS = ("entity_canon", "world_guide", "entity_t2i", "shot_dependency_t2i")
# Outlooks besides the default one assumed per character (the sample stories have 0-3).
OUTLOOKS_PER_CHARACTER = 2


@dataclass(frozen=True)
class CallEstimate:
    """Estimated provider calls of one episode, in total and per step."""

    scenes: int
    per_step: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.per_step.values())

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "scenes": self.scenes, "per_step": dict(self.per_step)}


def estimate_calls(parsed_story: Mapping[str, Any], project: ProjectConfig) -> CallEstimate:
    """The calls the storyboard will make for a story parsed by ``story_source``."""
    scenes = len(parsed_story.get("scenes") or [])
    knobs = project.scenes
    characters = project.entities.max_characters
    per_step = {step: 1 for step in SINGLE_CALL_STEPS}
    per_step["scene_detail"] = scenes
    per_step["t2i_review"] = 1 if project.review.enabled else 0
    per_step["ref_image_gen"] = characters
    per_step["composite_image_gen"] = characters * OUTLOOKS_PER_CHARACTER
    per_step["scene_image_pipeline"] = scenes * knobs.shots_per_scene * knobs.variations_per_shot
    return CallEstimate(scenes, per_step)
