"""logline: a step added to the storyboard from this one module (docs/DESIGN.md#adding-a-step).

Everything the step is lives here: its declaration (id, deps, the config keys that make it
stale), its prompt and the call it makes, what the offline model answers to that call, and
its own error codes. Adding it to a code location is one line: ``build_defs(steps=(*
STORYBOARD_STEPS, Logline()))``.
"""

from collections.abc import Mapping
from typing import Any

from pipeline_defs.project import TEXT_MODEL_KEYS
from pipeline_defs.resume.errors import Code, PipelineError
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.spec import Step, StepResult
from pipeline_defs.storyboard import offline_language as prose
from pipeline_defs.storyboard.replies import reply_text
from resources.checkpoints.envelope import Checkpoint
from resources.providers import TextCall

TASK = "logline"
MAX_WORDS = 40
PROMPT = 'Write a one-sentence logline of the story in INPUT. Answer JSON: {"logline": str}.'


class LoglineCode(Code):
    """The step's own error codes."""

    TOO_LONG = "logline.too_long", 422


def offline_reply(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The story's first sentence, cut to twenty words."""
    sentences = prose.split_sentences(prose.require(payload, "text", str))
    return {"logline": prose.words_of(sentences[0], 20) if sentences else ""}


class Logline(Step):
    step_id = "logline"
    deps = ("story_source",)
    resume_config_keys = TEXT_MODEL_KEYS
    description = "A one-sentence logline of the story."
    offline_replies = {TASK: offline_reply}

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        story = inputs["story_source"].data
        text = "\n".join(str(s["text"]) for s in story["scenes"])
        reply = ctx.providers.text(TextCall(task=TASK, prompt=PROMPT, payload={"text": text}))
        logline = reply_text(reply.data, "logline", task=TASK, where="reply")
        if len(logline.split()) > MAX_WORDS:
            raise PipelineError(
                LoglineCode.TOO_LONG, f"{TASK}: the model wrote more than {MAX_WORDS} words"
            )
        return StepResult(data={"logline": logline}, summary=logline)
