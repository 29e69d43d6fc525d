"""What a step is: a declaration (ids, deps, contract) plus its body and verifier.

A step subclasses :class:`Step`, sets the class attributes and implements ``execute``.
Everything about *when* it runs (judge, claim, fencing, audit) lives in the shared run
protocol; a step never copies it.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pipeline_defs.resume.completion import CompletionReport, Origin
from pipeline_defs.resume.status import StepStatus
from resources.providers.offline_text import OFFLINE_REPLIES, OfflineReply

if TYPE_CHECKING:
    from pipeline_defs.steps.context import StepContext, VerifyContext
    from resources.checkpoints.envelope import Artifact, Checkpoint


@dataclass(frozen=True)
class Mutation:
    """An in-place edit of another step's checkpoint data, applied by the protocol."""

    victim: str
    data: Mapping[str, Any]
    fields: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class Markdown:
    """A metadata value shown rendered on the asset page (a contact sheet of pictures).

    Steps know nothing of Dagster: the asset factory turns this marker into Dagster's
    markdown metadata, as it passes plain values (str, int, float, bool) through.
    """

    text: str


@dataclass(frozen=True)
class StepResult:
    """What a step body produced. Counts decide completed / partial / failed.

    ``metadata`` goes on the run's materialization event: plain values or ``Markdown``;
    anything else is left out.
    """

    data: Mapping[str, Any]
    applicable_count: int = 1
    failed_count: int = 0
    completed_count: int | None = None
    artifacts: tuple["Artifact", ...] = ()
    summary: str = ""
    mutations: tuple[Mutation, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def completed(self) -> int:
        if self.completed_count is not None:
            return self.completed_count
        return max(0, self.applicable_count - self.failed_count)

    @property
    def status(self) -> StepStatus:
        if self.failed_count == 0:
            return StepStatus.COMPLETED
        return StepStatus.PARTIAL if self.completed > 0 else StepStatus.FAILED


@dataclass(frozen=True)
class ItemSource:
    """An upstream item one of a step's items was built from, and the sha256 it had then."""

    step_id: str
    item_id: str
    sha256: str


@dataclass(frozen=True)
class CleanupReport:
    removed: tuple[str, ...] = ()
    note: str = "nothing to clean"


class Step:
    """Base declaration. Subclasses override class attributes and ``execute``."""

    step_id: ClassVar[str]
    deps: ClassVar[tuple[str, ...]] = ()
    schema_version: ClassVar[int] = 1
    # Bump when verify_completion / validate_data change what they accept: seals written
    # under another revision are void, so read-only judges verify old checkpoints again
    # (a schema_version bump would instead block them as contract drift).
    verify_revision: ClassVar[int] = 1
    resume_config_keys: ClassVar[tuple[str, ...]] = ()
    allow_auto_rerun_on_schema_bump: ClassVar[bool] = False
    modifies_checkpoints: ClassVar[tuple[str, ...]] = ()
    description: ClassVar[str] = ""
    # An artifact whose bytes no longer match its recorded sha256: by default a drift that
    # blocks (never silently regenerated over the evidence); a step that archives the old
    # file and redraws just that item declares ARTIFACT_MISSING instead.
    changed_artifact_origin: ClassVar[Origin] = Origin.INVARIANT_DRIFT
    # Whether a launch may redraw chosen items (tag resume/redraw, steps.redraw).
    redrawable: ClassVar[bool] = False
    # What the offline text model answers to each task this step sends (``TextCall.task``
    # -> its reply), declared beside the step: registered with the offline model when the
    # class is defined, so the default provider answers it on every launch path
    # (docs/DESIGN.md#adding-a-step).
    offline_replies: ClassVar[Mapping[str, OfflineReply]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for task, reply in cls.__dict__.get("offline_replies", {}).items():
            OFFLINE_REPLIES.register(task, reply)

    # ``is_applicable``, ``verify_completion`` and ``verify_reads`` are asked by the
    # read-only judge: their context holds the stores' readers only (``VerifyContext``).
    def is_applicable(self, ctx: "VerifyContext") -> bool:
        return True

    def verify_completion(self, ctx: "VerifyContext", checkpoint: "Checkpoint") -> CompletionReport:
        """Default: a present checkpoint is clean. Override to check files, rows, sentinels."""
        return CompletionReport.clean()

    def verify_reads(self, ctx: "VerifyContext") -> tuple[Path, ...]:
        """Files ``verify_completion`` reads beyond its usual inputs.

        Part of the verifier's contract: the seal of a published checkpoint covers the
        checkpoint, its artifacts, the episode's input directory and the files in it, plus
        these (resources.checkpoints.seal); a verifier reading anything else, including
        project config keys beyond ``resume_config_keys`` (list ``project_config_path``),
        must name it here, or a sealed verdict could outlive a change.
        """
        return ()

    def redraw_items(self, checkpoint: "Checkpoint") -> tuple[str, ...]:
        """Ids of the items a redraw may name (a ``redrawable`` step lists them)."""
        return ()

    def items_from_older_prompts(
        self, ctx: "VerifyContext", checkpoint: "Checkpoint"
    ) -> tuple[str, ...]:
        """Ids of the items of ``checkpoint`` made from a prompt other than the one asked for
        now (an upstream prompt edited, accepted or reviewed, since): what a re-run redoes
        and the contact sheet marks outdated. None for a step without items."""
        return ()

    def item_sources(self, checkpoint: "Checkpoint") -> Mapping[str, tuple[ItemSource, ...]]:
        """Item id -> the upstream items it was built from, as ``checkpoint`` records them."""
        return {}

    def validate_data(self, data: Mapping[str, Any], *, source: str) -> None:
        """Check sentinels in ``data``; raise ``io.integrity_violation`` naming ``source``."""

    def accept_edit(self, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """``data`` as edited by hand, with what the step derives from it recomputed (the
        sentinel hashes of edited prompts, say), for ``storyboard accept``. What cannot be
        derived is left as edited: ``validate_data`` and the verifier then judge it, and an
        edit they refuse is refused. Default: nothing is derived."""
        return data

    def cleanup_artifacts(self, ctx: "StepContext") -> CleanupReport:
        return CleanupReport()

    def execute(self, ctx: "StepContext", inputs: Mapping[str, "Checkpoint"]) -> StepResult:
        raise NotImplementedError(f"step {self.step_id} has no execute()")

    def __repr__(self) -> str:
        return f"<step {self.step_id} v{self.schema_version}>"


def step_import_path(step: Step) -> str:
    """``module:QualName`` of a step class, so any process can find its contract."""
    cls = type(step)
    return f"{cls.__module__}:{cls.__qualname__}"


def load_step(path: str) -> Step:
    import importlib

    module_name, _, qualname = path.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target()  # type: ignore[no-any-return]
