"""scene_image_pipeline: one PNG per shot variation, composed from its references.

Runtime fail-soft: a shot whose reference or composite is missing is not drawn (never
with a wrong or default reference); it is counted failed and the step ends partial, so a
later resume fills in exactly those shots.
"""

from collections.abc import Mapping
from typing import Any

from pipeline_defs.project import IMAGE_MODEL_KEYS
from pipeline_defs.steps.context import VerifyContext
from pipeline_defs.steps.spec import ItemSource
from pipeline_defs.storyboard.entity_canon import DEFAULT_OUTLOOK
from pipeline_defs.storyboard.image_jobs import ImageJob, ImagePlan, upstream_file
from pipeline_defs.storyboard.images import ImageStep
from pipeline_defs.storyboard.scene_detail import item_id, shot_id
from resources.checkpoints.envelope import Checkpoint

COMPOSITE_STEP = "composite_image_gen"


class SceneImagePipeline(ImageStep):
    step_id = "scene_image_pipeline"
    deps = ("scene_detail", "shot_dependency_t2i", "composite_image_gen", "t2i_review")
    schema_version = 1
    resume_config_keys = ("image.width", "image.height", *IMAGE_MODEL_KEYS)
    description = "One PNG per shot variation; shots with missing references fail soft."
    kind = "shot"

    def _source(
        self, ctx: VerifyContext, composites: Mapping[str, Any], need: Mapping[str, Any]
    ) -> ItemSource | None:
        """The picture a need is drawn from, if its bytes still match its record."""
        cid, oid = need["character_id"], need["outlook_id"]
        if oid == DEFAULT_OUTLOOK:
            ref = (composites.get("references") or {}).get(cid)
            if not ref:
                return None
            found = upstream_file(ctx, ref["step"], ref)
            if found is None:  # redrawn since composite_image_gen recorded it: the current one
                current = ctx.upstream(ref["step"])
                entry = (current.data.get("images") or {}).get(cid) if current else None
                found = upstream_file(ctx, ref["step"], entry)
            return ItemSource(ref["step"], cid, found[1]) if found else None
        item = f"{cid}_{oid}"
        found = upstream_file(ctx, COMPOSITE_STEP, (composites.get("images") or {}).get(item))
        return ItemSource(COMPOSITE_STEP, item, found[1]) if found else None

    def plan(self, ctx: VerifyContext, inputs: Mapping[str, Checkpoint]) -> ImagePlan:
        scenes = inputs["scene_detail"].data["scenes"]
        deps = {s["shot_id"]: s for s in inputs["shot_dependency_t2i"].data["shots"]}
        composites = inputs[COMPOSITE_STEP].data
        background = set(composites.get("skipped_characters") or [])
        plan = ImagePlan(jobs=[])
        for list_index, entry in enumerate(scenes):
            shot = deps.get(shot_id(entry["scene_index"], list_index))
            sources: list[ItemSource] = []
            problems: list[str] = []
            for need in (shot or {}).get("needs", []):
                if need["character_id"] in background:
                    continue  # a background character has no reference by design
                found = self._source(ctx, composites, need)
                if found is None:
                    problems.append(f"{need['character_id']}/{need['outlook_id']}")
                else:
                    sources.append(found)
            blocked = None
            if shot is None:
                blocked = "shot_dependency_t2i has no record for this shot"
            elif problems:
                blocked = f"missing reference image(s) {', '.join(problems)}"
            for variation in entry["t2i_variations"]:
                item = item_id(entry["scene_index"], list_index, variation["variation_index"])
                dependency = shot["dependency_prompt"] if shot else ""
                plan.jobs.append(
                    ImageJob(
                        item_id=item,
                        path=f"shots/{item}.png",
                        prompt=f"{variation['t2i_prompt']} | {dependency}",
                        caption=f"{item} - {entry['description']}",
                        seed_parts=tuple(s.sha256 for s in sources),
                        blocked=blocked,
                        record={"scene_index": entry["scene_index"], "list_index": list_index},
                        sources=tuple(sources),
                    )
                )
        return plan
