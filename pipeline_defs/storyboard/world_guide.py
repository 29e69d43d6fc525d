"""world_guide: the style bible every prompt of the episode follows (tone, palette, places)."""

import hashlib
from collections.abc import Mapping
from typing import Any

from pipeline_defs.project import TEXT_MODEL_KEYS
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.spec import Step, StepResult
from pipeline_defs.storyboard import offline_language as prose
from pipeline_defs.storyboard.replies import reply_list, reply_text
from resources.checkpoints.envelope import Checkpoint
from resources.providers import TextCall

TASK = "world_guide"
PROMPT = (
    "Write the visual style guide of this story for a storyboard artist. Answer JSON: "
    '{"style": str, "tone": str, "lighting": str, "palette": [hex colour str], '
    '"locations": [{"name": str, "first_scene": int}], "cast": [{"character_id": str, '
    '"name": str, "look": str}], "rules": [str]}. Use the project style given in INPUT.'
)


def offline_reply(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Style bible: tone from the story's words, palette seeded by title/style, places."""
    style = prose.require(payload, "style", str)
    title = str(payload.get("title") or "")
    scenes = prose.require(payload, "scenes", list)
    names = {str(c.get("name")) for c in payload.get("characters", []) if isinstance(c, Mapping)}
    counts = dict.fromkeys(prose.MOODS, 0)
    locations: list[dict[str, Any]] = []
    seen: set[str] = set()
    for scene in scenes:
        text = str(scene.get("text", ""))
        for word in prose.WORD.findall(text.lower()):
            for mood, words in prose.MOODS.items():
                counts[mood] += prose.base_word(word) in words
        for sentence in prose.split_sentences(text):
            for place in prose.place_candidates(sentence, names):
                if place.lower() not in seen:
                    seen.add(place.lower())
                    locations.append({"name": place, "first_scene": scene.get("scene_index")})
    tone = max(sorted(counts), key=lambda m: counts[m])
    seed = hashlib.sha256(f"{title}|{style}|{tone}".encode()).hexdigest()
    palette = [f"#{seed[i : i + 6]}" for i in range(0, 30, 6)]
    cast = [
        {"character_id": c.get("character_id"), "name": c.get("name"), "look": c.get("description")}
        for c in payload.get("characters", [])
        if isinstance(c, Mapping)
    ]
    return {
        "style": style,
        "tone": tone,
        "lighting": prose.LIGHTING_BY_MOOD[tone],
        "palette": palette,
        "locations": locations,
        "cast": cast,
        "rules": [
            f"every frame is drawn as {style}",
            "a character keeps one outfit per scene; outfits change only where the story says",
            "reference sheets decide faces and proportions; never improvise a character",
        ],
    }


class WorldGuide(Step):
    step_id = "world_guide"
    deps = ("story_source", "entity_canon")
    schema_version = 1
    resume_config_keys = ("style", *TEXT_MODEL_KEYS)
    description = "Style/world guide: tone, lighting, palette, locations, cast looks."
    offline_replies = {TASK: offline_reply}  # what the offline model answers

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        story = inputs["story_source"].data
        canon = inputs["entity_canon"].data
        payload = {
            "title": story.get("title") or ctx.project.title,
            "style": ctx.project.style,
            "scenes": [
                {"scene_index": s["scene_index"], "heading": s["heading"], "text": s["text"]}
                for s in story["scenes"]
            ],
            "characters": [
                {
                    "character_id": c["character_id"],
                    "name": c["name"],
                    "description": c["description"],
                }
                for c in canon["characters"]
            ],
        }
        reply = ctx.providers.text(TextCall(task=TASK, prompt=PROMPT, payload=payload))
        locations = [
            {"name": str(loc.get("name")), "first_scene": loc.get("first_scene")}
            for loc in reply_list(reply, "locations", task=TASK)
            if isinstance(loc, Mapping) and loc.get("name")
        ]
        data = {
            "style": ctx.project.style,
            "tone": reply_text(reply.data, "tone", task=TASK, where="reply"),
            "lighting": reply_text(reply.data, "lighting", task=TASK, where="reply"),
            "palette": [str(p) for p in reply_list(reply, "palette", task=TASK)],
            "locations": locations,
            "cast": [
                dict(c) for c in reply_list(reply, "cast", task=TASK) if isinstance(c, Mapping)
            ],
            "rules": [str(r) for r in reply_list(reply, "rules", task=TASK)],
        }
        return StepResult(
            data=data,
            summary=f"tone {data['tone']}, {len(locations)} locations",
            metadata={"locations": len(locations)},
        )
