"""What a step body and its verifier see: its key, config, files and metered providers."""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline_defs.project import ProjectConfig, project_dir
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.envelope import Artifact, Checkpoint
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore
from resources.providers import ImageCall, ImageModel, ImageReply, TextCall, TextModel, TextReply


@dataclass
class ProviderMeter:
    """The one place every model call goes through, recorded in the cost ledger before it is
    sent and finished with its reply: a worker killed during a call leaves it unfinished
    ("unknown outcome" in ``storyboard status``), never unrecorded."""

    ledger: LedgerStore
    key: StepKey
    run_id: str | None
    text_model: TextModel | None
    image_model: ImageModel | None
    text_calls: int = 0
    image_calls: int = 0
    # Raises when the owner may no longer spend (its lease was lost): checked before every
    # call, so a worker whose row was taken over makes no further paid call.
    guard: Callable[[], None] | None = None

    def text(self, call: TextCall) -> TextReply:
        if self.guard is not None:
            self.guard()
        if self.text_model is None:
            raise PipelineError("provider.config", f"{self.key}: no text model configured")
        call_id = self.ledger.start_provider_call(self.key, self.run_id, kind="text")
        self.text_calls += 1
        try:
            reply = self.text_model.complete(call)
        except BaseException:
            self.ledger.finish_provider_call(call_id, units=0, model=None)  # failed, answered
            raise
        self.ledger.finish_provider_call(call_id, units=reply.units, model=reply.model)
        return reply

    def image(self, call: ImageCall) -> ImageReply:
        if self.guard is not None:
            self.guard()
        if self.image_model is None:
            raise PipelineError("provider.config", f"{self.key}: no image model configured")
        call_id = self.ledger.start_provider_call(self.key, self.run_id, kind="image")
        self.image_calls += 1
        try:
            reply = self.image_model.generate(call)
        except BaseException:
            self.ledger.finish_provider_call(call_id, units=0, model=None)  # failed, answered
            raise
        self.ledger.finish_provider_call(call_id, units=reply.units, model=reply.model)
        return reply

    @property
    def calls(self) -> int:
        return self.text_calls + self.image_calls


@dataclass
class StepContext:
    """Dagster-free context, so verifiers and bodies are testable on plain files."""

    key: StepKey
    project: ProjectConfig
    checkpoints: CheckpointStore
    ledger: LedgerStore
    run_id: str | None = None
    meter: ProviderMeter | None = None
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("storyboard"))

    @property
    def home(self) -> Path:
        return self.checkpoints.home

    @property
    def step_dir(self) -> Path:
        return self.checkpoints.step_dir(self.key)

    @property
    def episode_dir(self) -> Path:
        """Inputs of this episode: ``projects/<p>/episodes/<e>/``."""
        return project_dir(self.home, self.key.project_id) / "episodes" / self.key.episode_id

    def upstream(self, step_id: str) -> Checkpoint | None:
        return self.checkpoints.load(StepKey(self.key.project_id, self.key.episode_id, step_id))

    def artifact_path(self, relative: str) -> Path:
        return self.checkpoints.artifact_path(self.key, relative)

    def write_artifact(self, relative: str, payload: bytes) -> Artifact:
        return self.checkpoints.write_artifact(self.key, relative, payload)

    @property
    def providers(self) -> ProviderMeter:
        if self.meter is None:
            raise PipelineError(
                "step.provider_outside_run",
                f"{self.key}: providers are only available inside a claimed run",
            )
        return self.meter
