"""composite_image_gen: one PNG per (character, outlook ≠ O00), drawn from the reference.

It also passes the reference records on (``references``, ``skipped_characters``) so that
scene_image_pipeline can find every picture it needs among its declared inputs.
"""

from collections.abc import Mapping
from typing import Any

from pipeline_defs.project import IMAGE_MODEL_KEYS
from pipeline_defs.steps.context import VerifyContext
from pipeline_defs.steps.spec import ItemSource
from pipeline_defs.storyboard.entity_canon import DEFAULT_OUTLOOK
from pipeline_defs.storyboard.image_jobs import ImageJob, ImagePlan, upstream_file
from pipeline_defs.storyboard.images import ImageStep
from resources.checkpoints.envelope import Checkpoint

REF_STEP = "ref_image_gen"


class CompositeImageGen(ImageStep):
    step_id = "composite_image_gen"
    deps = ("ref_image_gen",)
    schema_version = 1
    resume_config_keys = ("image.width", "image.height", *IMAGE_MODEL_KEYS)
    description = "One PNG per (character, outlook other than O00)."
    kind = "composite"

    def plan(self, ctx: VerifyContext, inputs: Mapping[str, Checkpoint]) -> ImagePlan:
        refs = inputs[REF_STEP].data
        ref_images = refs.get("images") or {}
        plan = ImagePlan(jobs=[])
        references: dict[str, dict[str, Any]] = {}
        for c in refs.get("characters", []):
            cid = c["character_id"]
            found = upstream_file(ctx, REF_STEP, ref_images.get(cid))
            if found is not None:
                references[cid] = {"step": REF_STEP, "path": found[0], "sha256": found[1]}
            for o in c["outlooks"]:
                if o["outlook_id"] == DEFAULT_OUTLOOK:
                    continue
                item = f"{cid}_{o['outlook_id']}"
                blocked = None
                if found is None:
                    blocked = f"reference image of {cid} is missing"
                elif not o.get("t2i_prompt"):
                    blocked = f"no prompt for {cid}/{o['outlook_id']}"
                plan.jobs.append(
                    ImageJob(
                        item_id=item,
                        path=f"composites/{item}.png",
                        prompt=f"{o.get('t2i_prompt') or ''}; same face and build as the "
                        "reference sheet",
                        caption=f"{item} {c['name']} in {o['description']}",
                        seed_parts=(found[1] if found else None,),
                        blocked=blocked,
                        record={"character_id": cid, "outlook_id": o["outlook_id"]},
                        sources=(ItemSource(REF_STEP, cid, found[1]),) if found else (),
                    )
                )
        plan.extra["references"] = references
        plan.extra["skipped_characters"] = [s["item_id"] for s in refs.get("skipped", [])]
        return plan
