"""shot_dependency_t2i: for each shot, which reference images it needs and how to compose them."""

from collections.abc import Mapping
from typing import Any

from pipeline_defs.project import TEXT_MODEL_KEYS
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.spec import Step, StepResult
from pipeline_defs.storyboard import offline_language as prose
from pipeline_defs.storyboard.replies import reply_list, reply_object, reply_text
from pipeline_defs.storyboard.scene_detail import shot_id
from resources.checkpoints.envelope import Checkpoint
from resources.providers import BAD_RESPONSE, TextCall
from resources.providers.base import provider_error

TASK = "shot_dependency"
PROMPT = (
    "For each shot in INPUT, say which character reference images it depends on and write a "
    'composition prompt. Answer JSON: {"shots": [{"shot_id": str, "needs": '
    '[{"character_id": str, "outlook_id": str}], "dependency_prompt": str}]}, echoing '
    "every shot_id exactly once."
)


def offline_reply(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Which reference images each shot needs, and how to compose them."""
    style = prose.require(payload, "style", str)
    shots = []
    for shot in prose.require(payload, "shots", list):
        cast = [c for c in shot.get("characters", []) if isinstance(c, Mapping)]
        if cast:
            prompt = (
                f"{shot.get('camera_direction')}: place {prose.subject(cast)} exactly as in their "
                f"reference images; match {style}"
            )
        else:
            prompt = f"{shot.get('camera_direction')}: environment only, no characters; {style}"
        shots.append(
            {
                "shot_id": shot["shot_id"],
                "needs": [
                    {"character_id": c["character_id"], "outlook_id": c["outlook_id"]} for c in cast
                ],
                "dependency_prompt": prompt,
            }
        )
    return {"shots": shots}


class ShotDependencyT2I(Step):
    step_id = "shot_dependency_t2i"
    deps = ("scene_detail",)
    schema_version = 1
    resume_config_keys = ("style", *TEXT_MODEL_KEYS)
    description = "Per-shot dependency prompts: which references a shot needs."
    offline_replies = {TASK: offline_reply}  # what the offline model answers

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        scenes = inputs["scene_detail"].data["scenes"]
        shots_in: list[dict[str, Any]] = []
        for list_index, entry in enumerate(scenes):
            shots_in.append(
                {
                    "shot_id": shot_id(entry["scene_index"], list_index),
                    "scene_index": entry["scene_index"],
                    "list_index": list_index,
                    "camera_direction": entry["camera_direction"],
                    "description": entry["description"],
                    "characters": [dict(c) for c in entry["characters"]],
                }
            )
        # Names make the prompt readable; ids stay the contract.
        payload = {"style": ctx.project.style, "shots": shots_in}
        reply = ctx.providers.text(TextCall(task=TASK, prompt=PROMPT, payload=payload))
        answered: dict[str, Mapping[str, Any]] = {}
        for index, raw in enumerate(reply_list(reply, "shots", task=TASK)):
            item = reply_object(raw, task=TASK, where=f"shots[{index}]")
            answered.setdefault(reply_text(item, "shot_id", task=TASK, where="shots"), item)
        shots = []
        for shot in shots_in:
            found = answered.get(shot["shot_id"])
            if found is None:
                raise provider_error(BAD_RESPONSE, f"{TASK}: reply has no shot {shot['shot_id']}")
            item = found
            own = {(c["character_id"], c["outlook_id"]) for c in shot["characters"]}
            needs = []
            for raw in reply_list(item, "needs", task=TASK):
                need = reply_object(raw, task=TASK, where=f"{shot['shot_id']}.needs")
                key = (str(need.get("character_id")), str(need.get("outlook_id")))
                if key not in own:
                    raise provider_error(
                        BAD_RESPONSE, f"{TASK}: {shot['shot_id']} needs {key}, not in the shot"
                    )
                needs.append({"character_id": key[0], "outlook_id": key[1]})
            shots.append(
                {
                    "shot_id": shot["shot_id"],
                    "scene_index": shot["scene_index"],
                    "list_index": shot["list_index"],
                    "needs": needs,
                    "dependency_prompt": reply_text(
                        item, "dependency_prompt", task=TASK, where=shot["shot_id"]
                    ),
                }
            )
        return StepResult(
            data={"shots": shots},
            summary=f"{len(shots)} shot dependency prompts",
            metadata={"shots": len(shots)},
        )
