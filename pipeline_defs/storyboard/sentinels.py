"""The ``owned_validation`` sentinel of a scene_detail shot variation.

It sits next to the fields it protects and holds their content hashes, so a verifier can
tell "someone edited the prompt without refreshing its hash" (invariant drift) from "the
sentinel itself is absent or malformed" (contract drift). A mutator refreshes exactly the
field it changed, never the whole sentinel, so unrelated drift is not laundered away.
"""

import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import Code, PipelineError
from pipeline_defs.storyboard.cards import SceneDetailCode
from resources.checkpoints.envelope import canonical_json, sha256_text

VALIDATOR = "scene_detail.owned_validation/v1"
HASHED_FIELDS = ("t2i_prompt_hash", "owned_hash", "camera_direction_hash")
SENTINEL_FIELDS = (*HASHED_FIELDS, "validator")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def sentinel_error(
    message: str, *, code: Code = SceneDetailCode.SENTINEL_MALFORMED
) -> PipelineError:
    return PipelineError(code, message, origin=Origin.CONTRACT_DRIFT.value)


def owned_fields(entry: Mapping[str, Any], variation: Mapping[str, Any]) -> dict[str, Any]:
    """What scene_detail owns structurally for one variation (who, which shot, which take)."""
    return {
        "scene_index": entry["scene_index"],
        "shot_index": entry["shot_index"],
        "variation_index": variation["variation_index"],
        "characters": entry["characters"],
    }


def compute_sentinel_field(
    entry: Mapping[str, Any], variation: Mapping[str, Any], field: str
) -> str:
    """The value one sentinel field must hold for this entry/variation right now."""
    if field == "t2i_prompt_hash":
        return sha256_text(variation["t2i_prompt"])
    if field == "owned_hash":
        return sha256_text(canonical_json(owned_fields(entry, variation)))
    if field == "camera_direction_hash":
        return sha256_text(entry["camera_direction"])
    if field == "validator":
        return VALIDATOR
    raise ValueError(f"unknown sentinel field {field!r}")


def build_owned_validation(
    entry: Mapping[str, Any], variation: Mapping[str, Any]
) -> dict[str, str]:
    return {field: compute_sentinel_field(entry, variation, field) for field in SENTINEL_FIELDS}


def assert_sentinel_shape(sentinel: Any, *, where: str) -> None:
    """Required fields present with the right types; raises a contract-drift error otherwise."""
    if sentinel is None:
        raise sentinel_error(f"{where}: owned_validation is missing")
    if not isinstance(sentinel, Mapping):
        raise sentinel_error(f"{where}: owned_validation is not an object")
    absent = [f for f in SENTINEL_FIELDS if f not in sentinel]
    if absent:
        raise sentinel_error(f"{where}: owned_validation lacks {absent}")
    for field in HASHED_FIELDS:
        value = sentinel[field]
        if not isinstance(value, str) or not _HEX64.fullmatch(value):
            raise sentinel_error(f"{where}: owned_validation.{field} is not a sha256 hex digest")
    if sentinel["validator"] != VALIDATOR:
        raise sentinel_error(
            f"{where}: owned_validation.validator is {sentinel['validator']!r}, not {VALIDATOR!r}"
        )


def refresh_sentinel_field(
    scenes: Sequence[MutableMapping[str, Any]], list_index: int, variation_index: int, field: str
) -> str:
    """Recompute ONE field of one variation's sentinel in place; returns the new value.

    Refuses (typed error) a bad index or a sentinel that is absent or malformed: refreshing
    would otherwise manufacture a sentinel that vouches for data nobody validated.
    """
    if field not in HASHED_FIELDS:
        raise sentinel_error(f"cannot refresh sentinel field {field!r}")
    if not 0 <= list_index < len(scenes):
        raise sentinel_error(f"no scene entry at list index {list_index}")
    entry = scenes[list_index]
    variations = entry.get("t2i_variations") if isinstance(entry, Mapping) else None
    if not isinstance(variations, list) or not 0 <= variation_index < len(variations):
        raise sentinel_error(f"scene entry L{list_index} has no variation {variation_index}")
    variation = variations[variation_index]
    sentinel = variation.get("owned_validation") if isinstance(variation, Mapping) else None
    assert_sentinel_shape(sentinel, where=f"L{list_index}_V{variation_index}")
    value = compute_sentinel_field(entry, variation, field)
    sentinel[field] = value  # type: ignore[index]
    return value
