"""ref_image_gen: one reference sheet per active character (after the review's fixes).

Characters mentioned fewer than ``images.ref_min_mentions`` times are background: they
are listed as skipped (not missing), and later steps do not require a reference for them.
"""

from collections.abc import Mapping

from pipeline_defs.project import IMAGE_MODEL_KEYS
from pipeline_defs.steps.context import VerifyContext
from pipeline_defs.storyboard.entity_canon import DEFAULT_OUTLOOK
from pipeline_defs.storyboard.entity_t2i import entity_item_id
from pipeline_defs.storyboard.image_jobs import ImageJob, ImagePlan
from pipeline_defs.storyboard.images import ImageStep
from resources.checkpoints.envelope import Checkpoint


class RefImageGen(ImageStep):
    step_id = "ref_image_gen"
    deps = ("entity_canon", "entity_t2i", "t2i_review")
    schema_version = 1
    resume_config_keys = (
        "image.width",
        "image.height",
        "images.ref_min_mentions",
        *IMAGE_MODEL_KEYS,
    )
    description = "One reference PNG per active character."
    kind = "reference"

    def plan(self, ctx: VerifyContext, inputs: Mapping[str, Checkpoint]) -> ImagePlan:
        characters = inputs["entity_canon"].data["characters"]
        prompts = {p["item_id"]: p for p in inputs["entity_t2i"].data["prompts"]}
        threshold = ctx.project.images.ref_min_mentions
        plan = ImagePlan(jobs=[])
        active = []
        for c in characters:
            cid = c["character_id"]
            if c["mentions"] < threshold:
                plan.skipped.append(
                    {
                        "item_id": cid,
                        "name": c["name"],
                        "mentions": c["mentions"],
                        "reason": f"mentioned {c['mentions']}x, below images.ref_min_mentions "
                        f"{threshold}",
                    }
                )
                continue
            outlooks = []
            for o in c["outlooks"]:
                prompt = prompts.get(entity_item_id(cid, o["outlook_id"]))
                outlooks.append(
                    {
                        "outlook_id": o["outlook_id"],
                        "description": o["description"],
                        "t2i_prompt": prompt["t2i_prompt"] if prompt else None,
                    }
                )
            active.append({"character_id": cid, "name": c["name"], "outlooks": outlooks})
            default = prompts.get(entity_item_id(cid, DEFAULT_OUTLOOK))
            plan.jobs.append(
                ImageJob(
                    item_id=cid,
                    path=f"refs/{cid}.png",
                    prompt=default["t2i_prompt"] if default else "",
                    caption=f"{cid} {c['name']} - reference sheet ({DEFAULT_OUTLOOK})",
                    blocked=None if default else f"entity_t2i has no prompt for {cid}",
                    record={"name": c["name"]},
                )
            )
        plan.extra["characters"] = active
        return plan
