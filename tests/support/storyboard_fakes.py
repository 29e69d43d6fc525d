"""Tiny test-only steps and a Definitions factory for CLI and launch-path tests.

Loaded by the CLI through ``STORYBOARD_DEFS=storyboard_fakes:defs`` (this directory on
``PYTHONPATH``), so CLI tests do not depend on the real storyboard steps. Every step calls
providers through the metered context, so provider-call counts are real ledger rows.
"""

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import dagster as dg

from pipeline_defs.definitions import build_resources
from pipeline_defs.resume.completion import CompletionReport, Origin
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.steps.context import StepContext, VerifyContext
from pipeline_defs.steps.spec import Step, StepResult
from pipeline_defs.wiring.assets import build_step_assets
from resources.checkpoints.envelope import Checkpoint
from resources.pipeline import PipelineResource
from resources.providers import ImageCall, TextCall, TextModel, TextReply
from sensors.resume_sensor import build_resume_sensor

BARRIER_DIR_ENV = "STORYBOARD_FAKES_BARRIER_DIR"
BARRIER_SECONDS_ENV = "STORYBOARD_FAKES_BARRIER_SECONDS"
BARRIER_PARTIES = 2


class EchoTextModel(TextModel):
    """Deterministic text model: answers with the prompt's words."""

    @property
    def model_name(self) -> str:
        return "echo-text-v1"

    def complete(self, call: TextCall) -> TextReply:
        words = call.prompt.split()
        return TextReply(data={"words": words[:20], "task": call.task}, units=1, model="echo")


class Source(Step):
    """Reads the episode's story file; no provider call."""

    step_id = "source"
    description = "test source: the story text"

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        path = ctx.episode_dir / "story.md"
        if not path.is_file():
            raise PipelineError("input.invalid", f"story file {path} does not exist")
        text = path.read_text(encoding="utf-8")
        return StepResult(data={"text": text, "lines": [x for x in text.splitlines() if x]})


class Outline(Step):
    """One text call per story line (at most three); scoped to ``scenes.camera_style``."""

    step_id = "outline"
    deps = ("source",)
    resume_config_keys = ("scenes.camera_style",)
    description = "test outline: text calls"

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        lines = list(inputs["source"].data["lines"])[:3] or ["empty"]
        beats = []
        for line in lines:
            reply = ctx.providers.text(TextCall(task="outline", prompt=line, payload={}))
            beats.append(" ".join(reply.data["words"]))
        return StepResult(data={"beats": beats}, applicable_count=len(beats))

    def verify_completion(self, ctx: VerifyContext, checkpoint: Checkpoint) -> CompletionReport:
        if not isinstance(checkpoint.data.get("beats"), list):
            return CompletionReport.incomplete(Origin.CONTRACT_DRIFT, ("beats is not a list",))
        return CompletionReport.clean()


class Sketch(Step):
    """One image per beat, written as PNG artifacts."""

    step_id = "sketch"
    deps = ("outline",)
    description = "test sketch: image calls"

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        artifacts = []
        for index, beat in enumerate(inputs["outline"].data["beats"]):
            reply = ctx.providers.image(
                ImageCall(prompt=beat, caption=f"beat {index}", width=64, height=64, seed=beat)
            )
            artifacts.append(ctx.write_artifact(f"beat_{index:02d}.png", reply.png))
        return StepResult(
            data={"images": [a.path for a in artifacts]},
            artifacts=tuple(artifacts),
            applicable_count=len(artifacts),
        )


def _armed() -> Path | None:
    folder = os.environ.get(BARRIER_DIR_ENV)
    if not folder or not (Path(folder) / "armed").exists():
        return None
    return Path(folder)


def _wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + float(os.environ.get(BARRIER_SECONDS_ENV, "300"))
    while time.monotonic() < deadline and not condition():
        time.sleep(0.05)


def _barrier() -> None:
    """Hold every judge of ``probe`` until ``BARRIER_PARTIES`` launches arrived (if armed).

    Armed by creating ``armed`` in the directory named by ``STORYBOARD_FAKES_BARRIER_DIR``:
    the launches then judge together and race for the same claim.
    """
    root = _armed()
    if root is None:
        return
    marker = root / f"arrived-{os.getpid()}-{time.monotonic_ns()}"
    marker.write_text(json.dumps({"pid": os.getpid()}))
    _wait_for(lambda: len(list(root.glob("arrived-*"))) >= BARRIER_PARTIES)


def _hold() -> None:
    """While armed, the claim winner keeps running until the test writes ``release``."""
    root = _armed()
    if root is not None:
        _wait_for((root / "release").exists)


class Probe(Step):
    """One image call; judged behind a cross-process barrier when a test arms it."""

    step_id = "probe"
    deps = ("source",)
    description = "test probe: judged together by racing launches"

    def is_applicable(self, ctx: VerifyContext) -> bool:
        _barrier()
        return True

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        call = ImageCall(prompt="probe", caption="probe", width=64, height=64, seed="probe")
        reply = ctx.providers.image(call)
        _hold()
        return StepResult(data={"png_bytes": len(reply.png)})


FAKE_STEPS: tuple[Step, ...] = (Source(), Outline(), Sketch(), Probe())


def build_fake_defs(
    steps: tuple[Step, ...] = FAKE_STEPS, pipeline: PipelineResource | None = None
) -> dg.Definitions:
    resources = build_resources(pipeline)
    resources["text_model"] = EchoTextModel()
    return dg.Definitions(
        assets=build_step_assets(steps),
        sensors=[build_resume_sensor(steps)],
        resources=resources,
    )


defs = build_fake_defs()
