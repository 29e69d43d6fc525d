"""The run gate waits for the review, as the sensor does.

``ref_image_gen`` and ``scene_image_pipeline`` draw from prompts that ``t2i_review`` fixes
in place. When a victim of the review changed since it last ran (here an editor's
accepted hand edit of an ``entity_t2i`` prompt), the review's own row is still
``completed`` but its judgement re-runs it: a single-asset launch of an image step must
not draw from the unreviewed prompt in the meantime. It waits (``step.gate_blocked``,
naming the review and why), with no model call and no row of its own touched.
"""

import json

import pytest
from storyboard_support import EPISODE, Env

from pipeline_defs.definitions import defs
from pipeline_defs.operations.accept_command import accept
from pipeline_defs.operations.workspace import Workspace, steps_of
from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.errors import PipelineError

IMAGE_STEPS = ("ref_image_gen", "scene_image_pipeline")


def accept_prompt_edit(env: Env) -> None:
    """An editor's fix of one character prompt, accepted: a legitimate new victim version."""
    path = env.checkpoint_path("entity_t2i")
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["data"]["prompts"][0]["t2i_prompt"] = "a lighthouse keeper in oilskins, edited by hand"
    path.write_text(json.dumps(raw), encoding="utf-8")
    accept(Workspace(defs=defs, steps=steps_of(defs), pipeline=env.pipeline), EPISODE, "entity_t2i")


@pytest.mark.parametrize("step_id", IMAGE_STEPS)
def test_an_image_step_waits_while_the_review_must_run_again(env: Env, step_id: str) -> None:
    accept_prompt_edit(env)
    review_row = env.row("t2i_review")
    assert review_row is not None and review_row.status == "completed"
    review = env.judge("t2i_review")
    assert review.action is not ResumeAction.SKIP, review  # the review must run again
    before = env.row(step_id)
    calls = len(env.ledger.provider_calls())

    with pytest.raises(PipelineError) as raised:
        env.run_direct([step_id])

    assert raised.value.code == "step.gate_blocked"
    assert "t2i_review" in str(raised.value) and review.reason in str(raised.value)
    assert raised.value.details["upstream"] == "t2i_review"
    assert len(env.ledger.provider_calls()) == calls  # nothing drawn
    assert env.row(step_id) == before


def test_once_the_review_ran_the_image_step_judges_itself(env: Env) -> None:
    accept_prompt_edit(env)
    env.run_direct(["t2i_review"])
    outcomes = env.run_direct(["ref_image_gen"])
    assert outcomes["ref_image_gen"].decision.action is not ResumeAction.BLOCK


def test_a_review_whose_victim_was_edited_by_hand_says_it_waits_on_the_edit(env: Env) -> None:
    path = env.checkpoint_path("scene_detail")
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["data"]["scenes"][0]["t2i_variations"][0]["t2i_prompt"] = "edited by hand, not accepted"
    path.write_text(json.dumps(raw), encoding="utf-8")
    assert env.judge("scene_detail").action is ResumeAction.BLOCK

    reason = env.judge("t2i_review").reason
    assert "scene_detail: edited outside the pipeline, so it is blocked" in reason
    assert "t2i_review waits on it" in reason and "storyboard accept" in reason
    assert "unreadable" not in reason
