"""entity_canon: the cast. Characters get stable ids (C01…) and outlooks (O00 = default).

Ids are assigned here, by order of first appearance, never taken from the model: every
later step, file name and item id is keyed by them, so they must be reproducible.
"""

import re
from collections.abc import Mapping
from typing import Any

from pipeline_defs.project import TEXT_MODEL_KEYS
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.spec import Step, StepResult
from pipeline_defs.storyboard import offline_language as prose
from pipeline_defs.storyboard.replies import reply_int, reply_list, reply_object, reply_text
from resources.checkpoints.envelope import Checkpoint
from resources.providers import TextCall

TASK = "entity_canon"
DEFAULT_OUTLOOK = "O00"
PROMPT = (
    "List the recurring named characters of the story segments in INPUT, with how often "
    "each is mentioned and every costume or appearance change the text states. Answer "
    'JSON: {"characters": [{"name": str, "mentions": int, "first_scene": int, '
    '"first_position": int, "description": str, "outlooks": [{"description": str, '
    '"first_scene": int}]}]}. Keep characters with at least min_mentions mentions, at '
    "most max_characters of them."
)


def character_ids(canon: Mapping[str, Any]) -> list[str]:
    return [str(c["character_id"]) for c in canon.get("characters", [])]


def outlook_for_scene(character: Mapping[str, Any], scene_index: int) -> Mapping[str, Any]:
    """The outfit a character wears in a scene: the latest one introduced so far, else O00."""
    chosen: Mapping[str, Any] = character["outlooks"][0]
    for outlook in character["outlooks"][1:]:
        if int(outlook["first_scene"]) <= scene_index:
            chosen = outlook
    return chosen


def mentions(text: str, name: str) -> int:
    return len(re.findall(rf"\b{re.escape(name)}(?:'s|\u2019s)?\b", text))


def _parse(reply_item: Any, index: int) -> dict[str, Any]:
    where = f"characters[{index}]"
    item = reply_object(reply_item, task=TASK, where=where)
    outlooks = []
    for k, raw in enumerate(item.get("outlooks") or []):
        outlook = reply_object(raw, task=TASK, where=f"{where}.outlooks[{k}]")
        outlooks.append(
            {
                "description": reply_text(outlook, "description", task=TASK, where=where),
                "first_scene": reply_int(outlook, "first_scene", task=TASK, where=where),
            }
        )
    position = item.get("first_position")
    return {
        "name": reply_text(item, "name", task=TASK, where=where),
        "mentions": reply_int(item, "mentions", task=TASK, where=where),
        "first_scene": reply_int(item, "first_scene", task=TASK, where=where),
        "first_position": position if isinstance(position, int) else 0,
        "description": str(item.get("description") or "").strip() or "default look",
        "outlooks": outlooks,
    }


def offline_reply(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Characters = capitalized single words used as names; outlooks = costume cues."""
    parts = prose.segments(payload)
    min_mentions = int(payload.get("min_mentions", 1))
    max_characters = int(payload.get("max_characters", 99))
    sentences = [(scene, s) for scene, text in parts for s in prose.split_sentences(text)]
    names: set[str] = set()
    for _, sentence in sentences:
        names |= prose.name_candidates(sentence)

    info: dict[str, dict[str, Any]] = {}
    last_named: str | None = None
    position = 0
    for scene, sentence in sentences:
        for token in prose.tokens(sentence):
            if token.base in names:
                entry = info.setdefault(
                    token.base,
                    {"name": token.base, "mentions": 0, "first_scene": scene, "first_position": 0},
                )
                if entry["mentions"] == 0:
                    entry["first_position"] = position + token.start
                entry["mentions"] += 1
        for cue in prose.COSTUME_CUE.finditer(sentence):
            owner = last_named
            for token in prose.tokens(sentence[: cue.start()]):
                if token.base in names:
                    owner = token.base
            look = prose.clean_look(cue.group("what"))
            if owner is None or not look:
                continue
            outlooks = info[owner].setdefault("outlooks", [])
            if look.lower() not in {o["description"].lower() for o in outlooks}:
                outlooks.append({"description": look, "first_scene": scene})
        for token in prose.tokens(sentence):
            if token.base in names:
                last_named = token.base
        position += len(sentence) + 1

    full_text = "\n".join(text for _, text in parts)
    ranked = sorted(info.values(), key=lambda c: (-c["mentions"], c["first_position"], c["name"]))
    characters: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for entry in ranked:
        entry.setdefault("outlooks", [])
        entry["description"] = (
            prose.apposition(entry["name"], full_text) or "a character of the story"
        )
        if entry["mentions"] < min_mentions or len(characters) >= max_characters:
            dropped.append({"name": entry["name"], "mentions": entry["mentions"]})
        else:
            characters.append(entry)
    return {"characters": characters, "dropped": dropped}


class EntityCanon(Step):
    step_id = "entity_canon"
    deps = ("story_source",)
    schema_version = 1
    resume_config_keys = ("entities.max_characters", "entities.min_mentions", *TEXT_MODEL_KEYS)
    description = "Characters C01… with outlooks (O00 default, O01… from costume cues)."
    offline_replies = {TASK: offline_reply}  # what the offline model answers

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        story = inputs["story_source"].data
        knobs = ctx.project.entities
        payload = {
            "segments": [
                {
                    "segment_index": s["segment_index"],
                    "scene_index": s["scene_index"],
                    "text": s["text"],
                }
                for s in story["segments"]
            ],
            "min_mentions": knobs.min_mentions,
            "max_characters": knobs.max_characters,
        }
        reply = ctx.providers.text(TextCall(task=TASK, prompt=PROMPT, payload=payload))
        found: dict[str, dict[str, Any]] = {}
        for index, raw in enumerate(reply_list(reply, "characters", task=TASK)):
            parsed = _parse(raw, index)
            found.setdefault(parsed["name"], parsed)
        # The model may ignore the knobs; they are enforced here.
        ranked = sorted(
            found.values(), key=lambda c: (-c["mentions"], c["first_position"], c["name"])
        )
        eligible = [c for c in ranked if c["mentions"] >= knobs.min_mentions]
        kept = eligible[: knobs.max_characters]
        dropped = [
            {
                "name": c["name"],
                "mentions": c["mentions"],
                "reason": "below entities.min_mentions"
                if c["mentions"] < knobs.min_mentions
                else "over entities.max_characters",
            }
            for c in ranked
            if c not in kept
        ]
        characters = []
        for number, c in enumerate(
            sorted(kept, key=lambda c: (c["first_scene"], c["first_position"], c["name"])), start=1
        ):
            outlooks = [
                {
                    "outlook_id": DEFAULT_OUTLOOK,
                    "description": c["description"],
                    "first_scene": c["first_scene"],
                }
            ]
            for k, outlook in enumerate(
                sorted(c["outlooks"], key=lambda o: o["first_scene"]), start=1
            ):
                outlooks.append({"outlook_id": f"O{k:02d}", **outlook})
            characters.append(
                {
                    "character_id": f"C{number:02d}",
                    "name": c["name"],
                    "mentions": c["mentions"],
                    "first_scene": c["first_scene"],
                    "description": c["description"],
                    "outlooks": outlooks,
                }
            )
        outlook_count = sum(len(c["outlooks"]) - 1 for c in characters)
        return StepResult(
            data={"characters": characters, "dropped": dropped},
            summary=f"{len(characters)} characters, {outlook_count} costume outlooks, "
            f"{len(dropped)} dropped",
            metadata={"characters": len(characters), "outlooks": outlook_count},
        )
