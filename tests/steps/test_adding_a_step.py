"""A step added from one module, through the real Definitions (docs/DESIGN.md#adding-a-step).

``tests/support/logline_step.py`` holds everything the ``logline`` step is; the code
location that runs it is the shipped one with one more step in its list.
"""

import dagster as dg
import pytest
from logline_step import TASK, Logline, LoglineCode
from storyboard_support import EPISODE, Env

from pipeline_defs.definitions import build_defs
from pipeline_defs.project import ProviderConfig
from pipeline_defs.resume.errors import PipelineError, status_of
from pipeline_defs.steps.context import ProviderMeter
from pipeline_defs.steps.spec import Step
from pipeline_defs.storyboard import STORYBOARD_STEPS
from resources.providers import OfflineTextModel, TextCall, TextReply
from resources.providers.base import TEXT, ModelKind


def _location(env: Env) -> dg.Definitions:
    return build_defs(steps=(*STORYBOARD_STEPS, Logline()), pipeline=env.pipeline)


def test_one_module_and_one_line_make_a_step_of_the_code_location(env: Env) -> None:
    defs = _location(env)
    spec = {s.key.to_user_string(): s for s in defs.resolve_all_asset_specs()}
    assert "logline" in spec, sorted(spec)
    assert {d.asset_key.to_user_string() for d in spec["logline"].deps} == {"story_source"}
    assert spec["logline"].description == Logline.description
    # Its offline answer and its error codes came with it.
    reply = OfflineTextModel(latency_ms=0).complete(
        TextCall(task=TASK, prompt="", payload={"text": "Mira lit the lamp. Then it rained."})
    )
    assert reply.data == {"logline": "Mira lit the lamp."}
    assert status_of("logline.too_long") == LoglineCode.TOO_LONG.status == 422


def test_the_new_step_runs_is_judged_and_resumes_like_the_shipped_ones(env: Env) -> None:
    defs = _location(env)
    first = env.materialize(["logline"], defs=defs)
    assert first.calls == {"logline": {"text": 1}}
    checkpoint = env.checkpoints.load(env.key("logline"))
    assert checkpoint is not None and checkpoint.data["logline"]
    again = env.materialize(["logline"], defs=defs)
    assert again.decisions == {"logline": "skip"}
    assert again.total_calls == 0


def test_two_steps_cannot_answer_one_task_differently() -> None:
    def other(payload: object) -> dict[str, str]:
        return {"logline": "another answer"}

    with pytest.raises(PipelineError, match=r"answered by .*offline_reply already"):

        class Rival(Step):
            step_id = "rival"
            offline_replies = {TASK: other}


class EchoModel:
    """A model of a kind the code base has never heard of."""

    model_name = "echo-v1"

    def for_provider(self, provider: ProviderConfig) -> "EchoModel":
        return self

    def preflight(self) -> None:
        pass

    def answer(self, said: str) -> TextReply:
        return TextReply(data={"echo": said}, units=3, model=self.model_name)


def _answer(model: EchoModel, said: str) -> TextReply:
    return model.answer(said)


# Its replies are JSON objects: the journal keeps them as the text kind does.
ECHO: ModelKind[str, TextReply] = ModelKind(
    "echo", "echo_model", ("provider.kind", "provider.echo_model"), _answer, TEXT.keep, TEXT.revive
)


def test_a_new_kind_of_model_is_metered_and_counted_like_text_and_image(env: Env) -> None:
    """The meter and the cost ledger take any kind: a new kind's calls are recorded before
    they are sent and finished with their units, under the kind's own word."""
    meter = ProviderMeter(env.ledger, env.key("logline"), "run-echo", {"echo": EchoModel()})
    assert meter.ask(ECHO, "hello").data == {"echo": "hello"}
    assert (meter.sent, meter.calls, meter.resolved_model) == ({"echo": 1}, 1, "echo-v1")
    recorded = [c for c in env.ledger.provider_calls(episode=EPISODE) if c["kind"] == "echo"]
    assert [(c["step_id"], c["units"], c["model"]) for c in recorded] == [("logline", 3, "echo-v1")]
    assert ECHO.called_by(("provider.kind", "provider.echo_model"))
