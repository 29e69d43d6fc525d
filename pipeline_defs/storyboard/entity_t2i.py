"""entity_t2i: one text-to-image prompt per (character, outlook), each with its own hash.

The only step allowed to re-run by itself after a schema bump: its output is cheap, has no
images of its own, and nothing mutates it except the review, which re-applies its fixes.
"""

import copy
from collections.abc import Mapping
from typing import Any

from pipeline_defs.project import TEXT_MODEL_KEYS
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.spec import Step, StepResult
from pipeline_defs.storyboard import offline_language as prose
from pipeline_defs.storyboard.replies import reply_list, reply_object, reply_text
from resources.checkpoints.envelope import Checkpoint, sha256_text
from resources.providers import BAD_RESPONSE, TextCall
from resources.providers.base import provider_error

TASK = "entity_t2i"
PROMPT = (
    "Write one text-to-image prompt per character outlook in INPUT: a full-body reference "
    'of that character in that outfit. Answer JSON: {"prompts": [{"character_id": str, '
    '"outlook_id": str, "t2i_prompt": str}]} covering every (character_id, outlook_id) '
    "exactly once; every prompt must carry the project style."
)


def entity_item_id(character_id: str, outlook_id: str) -> str:
    return f"E_{character_id}_{outlook_id}"


def prompt_problems(data: Mapping[str, Any]) -> list[tuple[Origin, str]]:
    """Shape problems (contract drift) and stale prompt hashes (invariant drift)."""
    prompts = data.get("prompts")
    if not isinstance(prompts, list):
        return [(Origin.CONTRACT_DRIFT, "data.prompts is missing or not a list")]
    problems: list[tuple[Origin, str]] = []
    for index, prompt in enumerate(prompts):
        fields = ("item_id", "character_id", "outlook_id", "t2i_prompt", "t2i_prompt_hash")
        if not isinstance(prompt, Mapping) or not all(
            isinstance(prompt.get(f), str) for f in fields
        ):
            problems.append((Origin.CONTRACT_DRIFT, f"prompts[{index}] is malformed"))
        elif prompt["t2i_prompt_hash"] != sha256_text(prompt["t2i_prompt"]):
            problems.append(
                (Origin.INVARIANT_DRIFT, f"{prompt['item_id']}: t2i_prompt_hash is stale")
            )
    return problems


def offline_reply(payload: Mapping[str, Any]) -> dict[str, Any]:
    """One prompt per (character, outlook); outfit prompts forget the style (review fixes it)."""
    style = prose.require(payload, "style", str)
    prompts = []
    for c in prose.require(payload, "characters", list):
        name, description = c["name"], c.get("description") or "a character"
        for outlook in c.get("outlooks", []):
            if outlook["outlook_id"] == "O00":
                prompt = (
                    f"character reference sheet of {name}, {description}, full body, front and "
                    f"side views, neutral background, {style}"
                )
            else:
                prompt = f"{name} wearing {outlook['description']}, full body, neutral background"
            prompts.append(
                {
                    "character_id": c["character_id"],
                    "outlook_id": outlook["outlook_id"],
                    "t2i_prompt": prompt,
                }
            )
    return {"prompts": prompts}


class EntityT2I(Step):
    step_id = "entity_t2i"
    deps = ("entity_canon",)
    schema_version = 1
    resume_config_keys = ("style", *TEXT_MODEL_KEYS)
    allow_auto_rerun_on_schema_bump = True
    description = "Per-entity text-to-image prompts (one per character outlook)."
    offline_replies = {TASK: offline_reply}  # what the offline model answers

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        characters = inputs["entity_canon"].data["characters"]
        payload = {
            "style": ctx.project.style,
            "characters": [
                {
                    "character_id": c["character_id"],
                    "name": c["name"],
                    "description": c["description"],
                    "outlooks": [
                        {"outlook_id": o["outlook_id"], "description": o["description"]}
                        for o in c["outlooks"]
                    ],
                }
                for c in characters
            ],
        }
        reply = ctx.providers.text(TextCall(task=TASK, prompt=PROMPT, payload=payload))
        answered: dict[tuple[str, str], str] = {}
        for index, raw in enumerate(reply_list(reply, "prompts", task=TASK)):
            where = f"prompts[{index}]"
            item = reply_object(raw, task=TASK, where=where)
            key = (
                reply_text(item, "character_id", task=TASK, where=where),
                reply_text(item, "outlook_id", task=TASK, where=where),
            )
            answered.setdefault(key, reply_text(item, "t2i_prompt", task=TASK, where=where))
        prompts = []
        for c in characters:
            for o in c["outlooks"]:
                key = (c["character_id"], o["outlook_id"])
                if key not in answered:
                    raise provider_error(BAD_RESPONSE, f"{TASK}: no prompt for {key[0]}/{key[1]}")
                prompts.append(
                    {
                        "item_id": entity_item_id(*key),
                        "character_id": key[0],
                        "outlook_id": key[1],
                        "name": c["name"],
                        "t2i_prompt": answered[key],
                        "t2i_prompt_hash": sha256_text(answered[key]),
                    }
                )
        return StepResult(
            data={"prompts": prompts},
            summary=f"{len(prompts)} entity prompts",
            metadata={"prompts": len(prompts)},
        )

    def accept_edit(self, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """Editors fix prompts: each prompt's ``t2i_prompt_hash`` follows its edited text."""
        edited = copy.deepcopy(dict(data))
        for prompt in edited.get("prompts") or []:
            if isinstance(prompt, dict) and isinstance(prompt.get("t2i_prompt"), str):
                prompt["t2i_prompt_hash"] = sha256_text(prompt["t2i_prompt"])
        return edited

    def validate_data(self, data: Mapping[str, Any], *, source: str) -> None:
        problems = prompt_problems(data)
        if problems:
            origin = Origin.CONTRACT_DRIFT
            if all(o is Origin.INVARIANT_DRIFT for o, _ in problems):
                origin = Origin.INVARIANT_DRIFT
            raise PipelineError(
                ErrorCode.IO_INTEGRITY_VIOLATION,
                f"checkpoint {source}: entity_t2i integrity: "
                + "; ".join(p for _, p in problems[:3]),
                origin=origin.value,
                details={"path": source},
            )
