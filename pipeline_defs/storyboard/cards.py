"""The render prompt card: the frozen description of what a shot variation must show.

Its hash is stored next to it. Editing the prompt text (the review's job) must never
change the card; a card whose stored hash no longer matches was edited behind the
pipeline's back (invariant drift), a card that is not a card is contract drift.
"""

from collections.abc import Mapping
from typing import Any

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import Code, PipelineError
from resources.checkpoints.envelope import canonical_json, sha256_text

CARD_TEMPLATE = "shot-card/v1"
# Fields each template version hashes. A template this code does not know is a contract
# mismatch (typed); a known template missing one of its fields is a bug in whoever wrote
# it, and surfaces as the KeyError it is (the judge reports verify_crashed).
CARD_FIELDS: Mapping[str, tuple[str, ...]] = {
    CARD_TEMPLATE: (
        "template",
        "scene_index",
        "shot_index",
        "variation_index",
        "camera_direction",
        "setting",
        "characters",
        "caption",
    ),
}


class SceneDetailCode(Code):
    """scene_detail's own error codes (its cards, sentinels and reply shape; here, below
    the step's module, because its cards and sentinels raise them too)."""

    CARD_INVALID = "scene_detail.card_invalid", 400
    SENTINEL_MALFORMED = "scene_detail.sentinel_malformed", 400
    SHAPE_VIOLATION = "scene_detail.shape_violation", 400


def card_error(message: str) -> PipelineError:
    return PipelineError(SceneDetailCode.CARD_INVALID, message, origin=Origin.CONTRACT_DRIFT.value)


def build_render_prompt_card(entry: Mapping[str, Any], variation_index: int) -> dict[str, Any]:
    return {
        "template": CARD_TEMPLATE,
        "scene_index": entry["scene_index"],
        "shot_index": entry["shot_index"],
        "variation_index": variation_index,
        "camera_direction": entry["camera_direction"],
        "setting": entry["setting"],
        "characters": [dict(c) for c in entry["characters"]],
        "caption": f"scene {entry['scene_index']}, shot {entry['shot_index'] + 1}: "
        f"{entry['description']}",
    }


def compute_card_hash(card: Any) -> str:
    """Recompute a card's hash. Typed error for a malformed card; KeyError for a broken one."""
    if not isinstance(card, Mapping):
        raise card_error(f"render_prompt_card is {type(card).__name__}, not an object")
    template = card.get("template")
    fields = CARD_FIELDS.get(template) if isinstance(template, str) else None
    if fields is None:
        raise card_error(f"render_prompt_card has unknown template {template!r}")
    if not isinstance(card.get("characters", []), list):
        raise card_error("render_prompt_card.characters is not a list")
    return sha256_text(canonical_json({name: card[name] for name in fields}))
