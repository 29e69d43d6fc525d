"""t2i_review: the editorial pass, a mutator of scene_detail and entity_t2i (docs/DESIGN.md#review).

Fixes are addressed by item id (``S{scene}_L{list}_V{variation}`` for shots,
``E_{character}_{outlook}`` for entity prompts) and applied by list index, because one
scene fans out over several entries: addressing by scene index once edited the wrong
shot. Only the changed prompt's ``t2i_prompt_hash`` is refreshed; every render card hash
is captured before and must be identical after. The edited victims are handed to the
shared protocol as ``Mutation``s, which archives, locks, records, re-verifies and rolls
back; this module never writes another step's checkpoint itself.
"""

import copy
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline_defs.project import TEXT_MODEL_KEYS
from pipeline_defs.resume.errors import Code, PipelineError
from pipeline_defs.steps.context import StepContext, VerifyContext
from pipeline_defs.steps.mutations import held_intents
from pipeline_defs.steps.spec import Mutation, Step, StepResult
from pipeline_defs.storyboard import offline_language as prose
from pipeline_defs.storyboard.replies import reply_list, reply_object, reply_text
from pipeline_defs.storyboard.scene_detail import item_id
from pipeline_defs.storyboard.sentinels import refresh_sentinel_field
from resources.checkpoints.envelope import Checkpoint, sha256_text
from resources.providers import TextCall

TASK = "t2i_review"
MUTATION_NOTE = "t2i_review prompt fixes"
PROMPT = (
    "Review these text-to-image prompts. Each must carry the project style and every "
    'required keyword. Answer JSON: {"fixes": [{"item_id": str, "t2i_prompt": str, '
    '"reason": str}]}; echo the item_id of the prompt you fix, exactly as given; leave '
    "good prompts out. Item ids: "
)


@dataclass(frozen=True)
class Fix:
    item_id: str
    t2i_prompt: str
    reason: str


def offline_reply(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Editorial pass: every prompt must carry the project style and the required keywords."""
    style = prose.require(payload, "style", str)
    keywords = [style, *[str(k) for k in payload.get("required_keywords", [])]]
    fixes = []
    for item in prose.require(payload, "items", list):
        prompt = str(item.get("t2i_prompt", ""))
        missing = [k for k in dict.fromkeys(keywords) if k and k.lower() not in prompt.lower()]
        if missing:
            fixes.append(
                {
                    "item_id": item["item_id"],
                    "t2i_prompt": prompt.rstrip(" .") + ", " + ", ".join(missing),
                    "reason": f"missing required keyword(s): {', '.join(missing)}",
                }
            )
    return {"fixes": fixes, "reviewed": len(payload["items"])}


class T2IReviewCode(Code):
    """The step's own error codes: the review's edits refused."""

    UNKNOWN_ITEM_ID = "t2i_review.unknown_item_id", 422
    SENTINEL_REFRESH_FAILED = "t2i_review.sentinel_refresh_failed", 422
    CARD_HASH_UNEXPECTED_CHANGE = "t2i_review.card_hash_unexpected_change", 422


def review_error(code: Code, message: str) -> PipelineError:
    return PipelineError(code, message)


def scene_item_map(scenes: Sequence[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """item id → (list index, variation index) for every shot variation."""
    return {
        item_id(entry["scene_index"], list_index, v): (list_index, v)
        for list_index, entry in enumerate(scenes)
        for v in range(len(entry["t2i_variations"]))
    }


def entity_item_map(prompts: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return {str(p["item_id"]): index for index, p in enumerate(prompts)}


def parse_fixes(reply_data: Mapping[str, Any], known: set[str]) -> list[Fix]:
    """The model's fixes; an item id we did not hand out is refused, never guessed."""
    fixes = []
    for index, raw in enumerate(reply_list(reply_data, "fixes", task=TASK)):
        where = f"fixes[{index}]"
        item = reply_object(raw, task=TASK, where=where)
        fix = Fix(
            item_id=reply_text(item, "item_id", task=TASK, where=where),
            t2i_prompt=reply_text(item, "t2i_prompt", task=TASK, where=where),
            reason=str(item.get("reason") or ""),
        )
        if fix.item_id not in known:
            raise review_error(
                T2IReviewCode.UNKNOWN_ITEM_ID,
                f"the reviewer answered item_id {fix.item_id!r}, which is not one of the "
                f"{len(known)} items it was given",
            )
        fixes.append(fix)
    return fixes


def apply_fixes(
    scenes: Sequence[MutableMapping[str, Any]],
    fixes: Sequence[Fix],
    item_map: Mapping[str, tuple[int, int]],
) -> tuple[int, list[tuple[int, int]]]:
    """Apply scene fixes in place by list index; returns (count, applied (L, V) indices)."""
    applied: list[tuple[int, int]] = []
    for fix in fixes:
        if fix.item_id not in item_map:
            raise review_error(
                T2IReviewCode.UNKNOWN_ITEM_ID,
                f"no shot variation has item_id {fix.item_id!r}",
            )
        list_index, v = item_map[fix.item_id]
        variation = scenes[list_index]["t2i_variations"][v]
        if variation["t2i_prompt"] == fix.t2i_prompt:
            continue
        variation["t2i_prompt"] = fix.t2i_prompt
        applied.append((list_index, v))
    return len(applied), applied


def card_hashes(scenes: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], Any]:
    return {
        (list_index, v): variation.get("render_prompt_card_hash")
        for list_index, entry in enumerate(scenes)
        for v, variation in enumerate(entry["t2i_variations"])
    }


def refresh_prompt_hashes(
    scenes: Sequence[MutableMapping[str, Any]], applied: Sequence[tuple[int, int]]
) -> None:
    """Refresh only ``t2i_prompt_hash`` of the applied variations; any failure is fatal."""
    for list_index, v in applied:
        try:
            refresh_sentinel_field(scenes, list_index, v, "t2i_prompt_hash")
        except (PipelineError, LookupError, TypeError, ValueError) as exc:
            message = (
                exc.message if isinstance(exc, PipelineError) else f"{type(exc).__name__}: {exc}"
            )
            raise review_error(
                T2IReviewCode.SENTINEL_REFRESH_FAILED,
                f"cannot refresh t2i_prompt_hash of L{list_index}_V{v}: {message}; "
                "scene_detail left unchanged",
            ) from exc


def apply_entity_fixes(
    prompts: Sequence[MutableMapping[str, Any]], fixes: Sequence[Fix], item_map: Mapping[str, int]
) -> list[str]:
    applied = []
    for fix in fixes:
        prompt = prompts[item_map[fix.item_id]]
        if prompt["t2i_prompt"] == fix.t2i_prompt:
            continue
        prompt["t2i_prompt"] = fix.t2i_prompt
        prompt["t2i_prompt_hash"] = sha256_text(fix.t2i_prompt)
        applied.append(fix.item_id)
    return applied


class T2IReview(Step):
    step_id = "t2i_review"
    deps = ("scene_detail", "entity_t2i")
    schema_version = 1
    resume_config_keys = ("style", "review.required_keywords", *TEXT_MODEL_KEYS)
    modifies_checkpoints = ("scene_detail", "entity_t2i")
    description = "Editorial review of all t2i prompts; fixes scene_detail/entity_t2i in place."
    offline_replies = {TASK: offline_reply}  # what the offline model answers

    def is_applicable(self, ctx: VerifyContext) -> bool:
        return ctx.project.review.enabled

    def _previous(self, ctx: StepContext) -> Checkpoint | None:
        try:
            return ctx.upstream(self.step_id)
        except PipelineError:
            return None  # unreadable: review everything again

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        scene_cp, entity_cp = inputs["scene_detail"], inputs["entity_t2i"]
        scenes: list[dict[str, Any]] = copy.deepcopy(list(scene_cp.data["scenes"]))
        prompts: list[dict[str, Any]] = copy.deepcopy(list(entity_cp.data["prompts"]))
        scene_map = scene_item_map(scenes)
        entity_map = entity_item_map(prompts)
        items = [
            {"item_id": item, "t2i_prompt": scenes[lst]["t2i_variations"][v]["t2i_prompt"]}
            for item, (lst, v) in scene_map.items()
        ] + [{"item_id": p["item_id"], "t2i_prompt": p["t2i_prompt"]} for p in prompts]
        # Re-run because a victim was rebuilt: review that victim again and
        # keep the previous review of a victim that still holds its edits, so the run ends
        # as a clean run would. With every victim holding (a force), review everything.
        previous = self._previous(ctx)
        held = set(held_intents(previous, inputs))
        if held == set(self.modifies_checkpoints):
            held = set()
        victim_of = dict.fromkeys(scene_map, "scene_detail") | dict.fromkeys(
            entity_map, "entity_t2i"
        )
        asked = [i for i in items if victim_of[i["item_id"]] not in held]
        payload = {
            "style": ctx.project.style,
            "required_keywords": list(ctx.project.review.required_keywords),
            "items": asked,
        }
        prompt = PROMPT + ", ".join(i["item_id"] for i in asked)
        reply = ctx.providers.text(TextCall(task=TASK, prompt=prompt, payload=payload))
        fixes = parse_fixes(reply.data, {i["item_id"] for i in asked})

        before = card_hashes(scenes)
        count, applied = apply_fixes(
            scenes, [f for f in fixes if f.item_id in scene_map], scene_map
        )
        after = card_hashes(scenes)
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        if changed:
            raise review_error(
                T2IReviewCode.CARD_HASH_UNEXPECTED_CHANGE,
                f"render_prompt_card_hash changed during the review for {changed[:5]}; "
                "a prompt fix must never touch a card",
            )
        refresh_prompt_hashes(scenes, applied)
        entity_applied = apply_entity_fixes(
            prompts, [f for f in fixes if f.item_id in entity_map], entity_map
        )

        inverse = {where: item for item, where in scene_map.items()}
        scene_items = [inverse[where] for where in applied]
        mutations = []
        if scene_items:
            mutations.append(
                Mutation(
                    victim="scene_detail",
                    data={**scene_cp.data, "scenes": scenes},
                    fields=tuple(
                        f"{item}.{field}"
                        for item in scene_items
                        for field in ("t2i_prompt", "owned_validation.t2i_prompt_hash")
                    ),
                    note=MUTATION_NOTE,
                )
            )
        if entity_applied:
            mutations.append(
                Mutation(
                    victim="entity_t2i",
                    data={**entity_cp.data, "prompts": prompts},
                    fields=tuple(
                        f"{item}.{field}"
                        for item in entity_applied
                        for field in ("t2i_prompt", "t2i_prompt_hash")
                    ),
                    note=MUTATION_NOTE,
                )
            )
        records = [
            {"item_id": f.item_id, "victim": victim_of[f.item_id], "reason": f.reason}
            for f in fixes
        ]
        applied_by_victim: dict[str, list[str]] = {
            "scene_detail": scene_items,
            "entity_t2i": entity_applied,
        }
        if held and previous is not None:  # the kept victims' part of the previous review
            kept = [f for f in previous.data.get("fixes") or [] if f.get("victim") in held]
            records = [
                f
                for victim in self.modifies_checkpoints
                for f in (kept if victim in held else records)
                if f.get("victim") == victim
            ]
            for victim in held:
                applied_by_victim[victim] = list(
                    (previous.data.get("applied") or {}).get(victim) or []
                )
        data = {
            "reviewed": len(items),
            "fixes": records,
            "applied": applied_by_victim,
            "card_hashes_checked": len(before),
        }
        return StepResult(
            data=data,
            applicable_count=1,
            summary=f"reviewed {len(items)} prompts, applied {count} shot and "
            f"{len(entity_applied)} entity fixes",
            mutations=tuple(mutations),
            metadata={"fixes": count + len(entity_applied), "reviewed": len(items)},
        )
