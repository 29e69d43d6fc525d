"""scene_detail: scenes, shots and text-to-image variations, each guarded by sentinels.

The data is a flat ``scenes`` list with one entry per shot, so one ``scene_index`` fans out
over several entries; anything that addresses an entry must use its list index (the
``S{scene}_L{list}_V{variation}`` item id), never the scene index alone.

Each variation carries an ``owned_validation`` sentinel and a ``render_prompt_card`` with
its hash. The verifier sorts what it finds (docs/DESIGN.md#origins): a shape the loader cannot read,
an absent/malformed sentinel or card, or a typed error while recomputing a card is
contract drift; a stored hash that disagrees with the content is invariant drift; any
other exception while recomputing is a verifier crash and is left to propagate so the
judge reports ``verify_crashed`` instead of guessing.
"""

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline_defs.project import TEXT_MODEL_KEYS
from pipeline_defs.resume.completion import ORIGIN_PRIORITY, CompletionReport, Origin, Severity
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.steps.context import StepContext, VerifyContext
from pipeline_defs.steps.spec import Step, StepResult
from pipeline_defs.storyboard import offline_language as prose
from pipeline_defs.storyboard.cards import (
    SceneDetailCode,
    build_render_prompt_card,
    compute_card_hash,
)
from pipeline_defs.storyboard.entity_canon import mentions, outlook_for_scene
from pipeline_defs.storyboard.replies import reply_list, reply_object, reply_text
from pipeline_defs.storyboard.sentinels import (
    HASHED_FIELDS,
    assert_sentinel_shape,
    build_owned_validation,
    compute_sentinel_field,
)
from resources.checkpoints.envelope import Checkpoint, sha256_text
from resources.providers import BAD_RESPONSE, TextCall
from resources.providers.base import provider_error

TASK = "scene_detail"
MAX_LISTED = 20
PROMPT = (
    'Break this scene into shots for a storyboard. Answer JSON: {"summary": str, '
    '"setting": str, "shots": [{"shot_index": int, "description": str, '
    '"camera_direction": str, "characters": [character_id], "variations": '
    '[{"t2i_prompt": str, "lighting": str}]}]} with exactly shots_per_scene shots and '
    "variations_per_shot variations each; only use the character ids given in INPUT; "
    "every t2i_prompt must carry the project style."
)


def item_id(scene_index: int, list_index: int, variation_index: int) -> str:
    """Deterministic address of one variation: unique even when a scene fans out."""
    return f"S{scene_index}_L{list_index}_V{variation_index}"


def shot_id(scene_index: int, list_index: int) -> str:
    return f"S{scene_index}_L{list_index}"


# ----------------------------------------------------------------------------- loader
@dataclass(frozen=True)
class Finding:
    """One problem in scene_detail data: where, what, and its origin (docs/DESIGN.md#origins)."""

    origin: Origin
    item: str
    problem: str

    def __str__(self) -> str:
        return f"{self.item}: {self.problem}"


def shape_error(message: str) -> PipelineError:
    return PipelineError(
        SceneDetailCode.SHAPE_VIOLATION, message, origin=Origin.CONTRACT_DRIFT.value
    )


def _entry_problem(entry: Any) -> str | None:
    """Why the loader cannot read an entry (None if it can)."""
    if not isinstance(entry, Mapping):
        return "entry is not an object"
    for name, kind in (("scene_index", int), ("shot_index", int)):
        if not isinstance(entry.get(name), kind) or isinstance(entry.get(name), bool):
            return f"{name} is missing or not an integer"
    for name in ("camera_direction", "setting", "description"):
        if not isinstance(entry.get(name), str):
            return f"{name} is missing or not text"
    characters = entry.get("characters")
    if not isinstance(characters, list) or not all(
        isinstance(c, Mapping)
        and isinstance(c.get("character_id"), str)
        and isinstance(c.get("outlook_id"), str)
        for c in characters
    ):
        return "characters is not a list of {character_id, outlook_id}"
    variations = entry.get("t2i_variations")
    if not isinstance(variations, list) or not variations:
        return "t2i_variations is missing, empty or not a list"
    for v, variation in enumerate(variations):
        if not isinstance(variation, Mapping):
            return f"t2i_variations[{v}] is not an object"
        if variation.get("variation_index") != v:
            return f"t2i_variations[{v}].variation_index is not {v}"
        if not isinstance(variation.get("t2i_prompt"), str):
            return f"t2i_variations[{v}].t2i_prompt is missing or not text"
    return None


def load_scenes(
    data: Mapping[str, Any],
) -> tuple[list[tuple[int, Mapping[str, Any]]], list[Finding]]:
    """The readable entries (with their list index) and a finding per unreadable one.

    Raises a typed shape error when there is no scenes list at all.
    """
    scenes = data.get("scenes")
    if not isinstance(scenes, list):
        raise shape_error("data.scenes is missing or not a list")
    if not scenes:
        raise shape_error("data.scenes is empty")
    readable: list[tuple[int, Mapping[str, Any]]] = []
    findings: list[Finding] = []
    for list_index, entry in enumerate(scenes):
        problem = _entry_problem(entry)
        if problem is None:
            readable.append((list_index, entry))
        else:
            findings.append(Finding(Origin.CONTRACT_DRIFT, f"L{list_index}", problem))
    return readable, findings


def _variation_findings(
    item: str, entry: Mapping[str, Any], variation: Mapping[str, Any]
) -> list[Finding]:
    found: list[Finding] = []
    sentinel: Any = variation.get("owned_validation")
    try:
        assert_sentinel_shape(sentinel, where=item)
    except PipelineError as exc:
        found.append(Finding(Origin.CONTRACT_DRIFT, item, exc.message.removeprefix(f"{item}: ")))
    else:
        for field in HASHED_FIELDS:
            if sentinel[field] != compute_sentinel_field(entry, variation, field):
                found.append(
                    Finding(Origin.INVARIANT_DRIFT, item, f"owned_validation.{field} is stale")
                )
    if "render_prompt_card" not in variation:
        found.append(Finding(Origin.CONTRACT_DRIFT, item, "render_prompt_card is absent"))
        return found
    stored = variation.get("render_prompt_card_hash")
    if not isinstance(stored, str):
        found.append(
            Finding(Origin.CONTRACT_DRIFT, item, "render_prompt_card_hash is absent or not text")
        )
        return found
    try:
        recomputed = compute_card_hash(variation["render_prompt_card"])
    except PipelineError as exc:  # typed: the card is not a card
        found.append(Finding(Origin.CONTRACT_DRIFT, item, exc.message))
        return found
    # Anything else raised by the recompute propagates: that is a verifier crash.
    if recomputed != stored:
        found.append(
            Finding(Origin.INVARIANT_DRIFT, item, "render_prompt_card_hash does not match the card")
        )
    return found


def inspect_scene_detail(data: Mapping[str, Any]) -> tuple[list[Finding], int]:
    """Every problem in the data and the number of items (variations + unreadable entries)."""
    try:
        readable, findings = load_scenes(data)
    except PipelineError as exc:
        return [Finding(Origin.CONTRACT_DRIFT, "scenes", exc.message)], 0
    total = len(findings)
    for list_index, entry in readable:
        for variation in entry["t2i_variations"]:
            total += 1
            item = item_id(entry["scene_index"], list_index, variation["variation_index"])
            findings.extend(_variation_findings(item, entry, variation))
    return findings, total


def worst_origin(findings: Sequence[Finding]) -> Origin:
    return max((f.origin for f in findings), key=ORIGIN_PRIORITY.__getitem__)


def report_for(findings: Sequence[Finding], total: int) -> CompletionReport:
    """Origin by SPEC priority; severity by how many items are affected."""
    if not findings:
        return CompletionReport.clean(variations=total)
    affected = {f.item for f in findings}
    severity = Severity.MISSING if total == 0 or len(affected) >= total else Severity.PARTIAL
    return CompletionReport.incomplete(
        worst_origin(findings),
        tuple(str(f) for f in findings[:MAX_LISTED]),
        severity,
        affected=len(affected),
        variations=total,
    )


# ----------------------------------------------------------------------------- building
def _characters_in_scene(
    characters: Sequence[Mapping[str, Any]], scene: Mapping[str, Any]
) -> list[dict[str, Any]]:
    present = []
    for character in characters:
        if mentions(scene["text"], character["name"]):
            outlook = outlook_for_scene(character, int(scene["scene_index"]))
            present.append(
                {
                    "character_id": character["character_id"],
                    "name": character["name"],
                    "outlook_id": outlook["outlook_id"],
                    "look": outlook["description"],
                }
            )
    return present


def build_entry(
    scene: Mapping[str, Any],
    shot: Mapping[str, Any],
    *,
    summary: str,
    setting: str,
    cast: Mapping[str, Mapping[str, Any]],
    where: str,
) -> dict[str, Any]:
    """One shot entry with its variations, sentinels and cards (all hashes fresh)."""
    ids = [str(c) for c in reply_list(shot, "characters", task=TASK)]
    unknown = [c for c in ids if c not in cast]
    if unknown:
        raise provider_error(BAD_RESPONSE, f"{TASK}: {where} names unknown characters {unknown}")
    entry: dict[str, Any] = {
        "scene_index": int(scene["scene_index"]),
        "shot_index": int(shot.get("shot_index", 0)),
        "heading": scene["heading"],
        "summary": summary,
        "setting": setting,
        "description": reply_text(shot, "description", task=TASK, where=where),
        "camera_direction": reply_text(shot, "camera_direction", task=TASK, where=where),
        "characters": [
            {
                "character_id": c,
                "name": cast[c]["name"],
                "outlook_id": cast[c]["outlook_id"],
                "look": cast[c]["look"],
            }
            for c in dict.fromkeys(ids)
        ],
        "t2i_variations": [],
    }
    raw_variations = reply_list(shot, "variations", task=TASK)
    if not raw_variations:
        raise provider_error(BAD_RESPONSE, f"{TASK}: {where} has no variations")
    for v, raw in enumerate(raw_variations):
        item = reply_object(raw, task=TASK, where=f"{where}.variations[{v}]")
        variation: dict[str, Any] = {
            "variation_index": v,
            "lighting": str(item.get("lighting") or ""),
            "t2i_prompt": reply_text(item, "t2i_prompt", task=TASK, where=where),
        }
        variation["owned_validation"] = build_owned_validation(entry, variation)
        card = build_render_prompt_card(entry, v)
        variation["render_prompt_card"] = card
        variation["render_prompt_card_hash"] = compute_card_hash(card)
        entry["t2i_variations"].append(variation)
    return entry


def offline_reply(payload: Mapping[str, Any]) -> dict[str, Any]:
    """Shots = evenly spread sentences that name characters; prompts from templates."""
    scene_index = prose.require(payload, "scene_index", int)
    text = prose.require(payload, "text", str)
    style = prose.require(payload, "style", str)
    camera_style = str(payload.get("camera_style") or "")
    shots_wanted = max(1, int(payload.get("shots_per_scene", 1)))
    variations_wanted = max(1, int(payload.get("variations_per_shot", 1)))
    characters = [c for c in payload.get("characters", []) if isinstance(c, Mapping)]
    by_name = {str(c["name"]): c for c in characters}
    sentences = prose.split_sentences(text) or [text.strip() or str(payload.get("heading", ""))]

    def named(sentence: str) -> list[Mapping[str, Any]]:
        seen: list[str] = []
        for token in prose.tokens(sentence):
            if token.base in by_name and token.base not in seen:
                seen.append(token.base)
        return [by_name[n] for n in seen]

    beats = [s for s in sentences if named(s)] or sentences
    scene_cast = [c for s in sentences for c in named(s)]
    places = [p for s in sentences for p in prose.place_candidates(s, set(by_name))]
    locations = [str(p) for p in payload.get("locations", []) if str(p) in text]
    setting = (locations or places or [str(payload.get("heading") or "the scene")])[0]
    shots = []
    for k in range(shots_wanted):
        beat = (
            beats[(k * len(beats)) // shots_wanted]
            if len(beats) >= shots_wanted
            else beats[k % len(beats)]
        )
        cast = named(beat) or scene_cast[:1]
        camera = prose.CAMERAS[k % len(prose.CAMERAS)]
        unquoted = re.sub(f'["{prose.LDQUO}{prose.RDQUO}]', "", beat).strip()
        description = prose.words_of(unquoted, prose.MAX_DESCRIPTION_WORDS)
        who = prose.subject(cast)
        variations = []
        for v in range(variations_wanted):
            light = prose.LIGHTS[(prose.digest(scene_index, k) + v) % len(prose.LIGHTS)]
            if camera == "close-up":
                prompt = f"close-up of {who}: {description} {light}."
            else:
                prompt = f"{camera} of {who} at {setting}: {description} {light}, {style}."
            variations.append({"t2i_prompt": prompt, "lighting": light})
        shots.append(
            {
                "shot_index": k,
                "description": description,
                "camera_direction": f"{camera}, {camera_style}" if camera_style else camera,
                "characters": [str(c["character_id"]) for c in cast],
                "variations": variations,
            }
        )
    return {
        "summary": prose.words_of(sentences[0], prose.MAX_DESCRIPTION_WORDS),
        "setting": setting,
        "shots": shots,
    }


class SceneDetail(Step):
    step_id = "scene_detail"
    deps = ("story_source", "entity_canon", "world_guide")
    schema_version = 1
    resume_config_keys = (
        "style",
        "scenes.shots_per_scene",
        "scenes.variations_per_shot",
        "scenes.camera_style",
        *TEXT_MODEL_KEYS,
    )
    description = "Shot breakdown with t2i variations, owned_validation sentinels, prompt cards."
    offline_replies = {TASK: offline_reply}  # what the offline model answers

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        story = inputs["story_source"].data
        characters = inputs["entity_canon"].data["characters"]
        guide = inputs["world_guide"].data
        knobs = ctx.project.scenes
        entries: list[dict[str, Any]] = []
        for scene in story["scenes"]:
            present = _characters_in_scene(characters, scene)
            payload = {
                "scene_index": scene["scene_index"],
                "heading": scene["heading"],
                "text": scene["text"],
                "style": ctx.project.style,
                "camera_style": knobs.camera_style,
                "shots_per_scene": knobs.shots_per_scene,
                "variations_per_shot": knobs.variations_per_shot,
                "characters": present,
                "locations": [loc["name"] for loc in guide.get("locations", [])],
                "tone": guide.get("tone"),
            }
            reply = ctx.providers.text(TextCall(task=TASK, prompt=PROMPT, payload=payload))
            summary = reply_text(reply.data, "summary", task=TASK, where="reply")
            setting = reply_text(reply.data, "setting", task=TASK, where="reply")
            shots = reply_list(reply, "shots", task=TASK)[: knobs.shots_per_scene]
            if not shots:
                raise provider_error(
                    BAD_RESPONSE, f"{TASK}: scene {scene['scene_index']} has no shots"
                )
            cast = {c["character_id"]: c for c in present}
            for k, raw in enumerate(shots):
                where = f"scene {scene['scene_index']} shots[{k}]"
                shot = reply_object(raw, task=TASK, where=where)
                entries.append(
                    build_entry(
                        scene, shot, summary=summary, setting=setting, cast=cast, where=where
                    )
                )
        variations = sum(len(e["t2i_variations"]) for e in entries)
        data = {
            "scenes": entries,
            "scene_count": len(story["scenes"]),
            "shot_count": len(entries),
            "variation_count": variations,
        }
        return StepResult(
            data=data,
            applicable_count=len(story["scenes"]),
            summary=f"{len(story['scenes'])} scenes, {len(entries)} shots, {variations} variations",
            metadata={"shots": len(entries), "variations": variations},
        )

    def accept_edit(self, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """Editors fix prompts: each variation's ``t2i_prompt_hash`` is recomputed from its
        (edited) prompt. Nothing else is: an edit of the characters, the camera direction or
        a card breaks their hashes and ``validate_data`` refuses it, naming the field."""
        edited = copy.deepcopy(dict(data))
        for entry in edited.get("scenes") or []:
            for variation in (entry.get("t2i_variations") or []) if isinstance(entry, dict) else []:
                if not isinstance(variation, dict):
                    continue
                sentinel, prompt = variation.get("owned_validation"), variation.get("t2i_prompt")
                if isinstance(sentinel, dict) and isinstance(prompt, str):
                    sentinel["t2i_prompt_hash"] = sha256_text(prompt)
        return edited

    def validate_data(self, data: Mapping[str, Any], *, source: str) -> None:
        """Sentinel shape and hashes; refuses corrupt data with the finding's origin."""
        findings, _ = inspect_scene_detail(data)
        if findings:
            listed = "; ".join(str(f) for f in findings[:3])
            more = f" (and {len(findings) - 3} more)" if len(findings) > 3 else ""
            raise PipelineError(
                ErrorCode.IO_INTEGRITY_VIOLATION,
                f"checkpoint {source}: scene_detail integrity: {listed}{more}",
                origin=worst_origin(findings).value,
                details={"path": source},
            )

    def verify_completion(self, ctx: VerifyContext, checkpoint: Checkpoint) -> CompletionReport:
        findings, total = inspect_scene_detail(checkpoint.data)
        return report_for(findings, total)
