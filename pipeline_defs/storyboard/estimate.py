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

When the project prices its models (``pricing:``, docs/DESIGN.md#money-budgets) the calls
are also estimated in money, at most (:func:`estimate_cost`): every text call at a worst
case, every picture at the image price. Money budgets are enforced call by call too; the
estimate is only said (``add-episode`` warns when it is over ``budget.max_cost_per_episode``).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline_defs.project import ProjectConfig, model_prices
from pipeline_defs.resume.money import REQUEST_OVERHEAD_TOKENS, Usage, money_text

# Text steps with one call per episode (the review is counted apart: it can be disabled).
SINGLE_CALL_STEPS = ("entity_canon", "world_guide", "entity_t2i", "shot_dependency_t2i")
# The steps whose calls are the text model's; the others' are the image model's.
TEXT_STEPS = (*SINGLE_CALL_STEPS, "scene_detail", "t2i_review")
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


@dataclass(frozen=True)
class CostEstimate:
    """The most an episode's estimated calls cost, micro-units: its text calls each at a
    text call's worst case, its pictures each at the image price."""

    text_calls: int
    image_calls: int
    text_call_micros: int  # one text call's worst case
    image_call_micros: int  # one picture

    @property
    def total(self) -> int:
        return self.text_calls * self.text_call_micros + self.image_calls * self.image_call_micros

    def as_dict(self) -> dict[str, Any]:
        return {
            "total_micros": self.total,
            "total": money_text(self.total),
            "text_calls": self.text_calls,
            "image_calls": self.image_calls,
            "text_call_micros": self.text_call_micros,
            "image_call_micros": self.image_call_micros,
        }


def text_call_worst_case(story_bytes: int, max_output_tokens: int) -> Usage:
    """The most one of the storyboard's text calls is taken to use: its request the whole
    story (every byte a token, as the meter counts a request) with the meter's framing and an
    earlier step's reply at most ``max_output_tokens`` carried in, and ``max_output_tokens``
    out (the limit a text call is sent with under a money budget)."""
    return Usage(
        input_tokens=story_bytes + REQUEST_OVERHEAD_TOKENS + max_output_tokens,
        output_tokens=max_output_tokens,
    )


def estimate_cost(
    estimate: CallEstimate, project: ProjectConfig, story_bytes: int
) -> CostEstimate | None:
    """The most ``estimate``'s calls cost at the project's prices; None unless the project
    prices its text or image model (``pricing:``) and both have a price (the offline models
    are free unless priced)."""
    provider = project.provider
    if provider.text_model not in project.pricing and provider.image_model not in project.pricing:
        return None
    prices = model_prices(project)
    text, image = prices.get(provider.text_model), prices.get(provider.image_model)
    if text is None or image is None:
        return None
    text_calls = sum(n for step, n in estimate.per_step.items() if step in TEXT_STEPS)
    worst = text_call_worst_case(story_bytes, project.budget.max_output_tokens)
    return CostEstimate(
        text_calls=text_calls,
        image_calls=estimate.total - text_calls,
        text_call_micros=text.cost(worst),
        image_call_micros=image.cost(Usage(images=1)),
    )
