"""What an image step is asked to draw: :class:`ImageJob` (one picture: where it goes, the
prompt, what it is drawn from, why it may be impossible), :class:`ImagePlan` (a step's jobs
and what it skipped) and :func:`upstream_file` (a reference picture another step recorded,
while its bytes still match). Each image step's ``plan`` builds these
(:class:`~pipeline_defs.storyboard.images.ImageStep` draws them).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline_defs.resume.files import file_sha256
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.context import VerifyContext
from pipeline_defs.steps.spec import ItemSource
from resources.checkpoints.envelope import canonical_json, sha256_text


@dataclass(frozen=True)
class ImageJob:
    """One picture to have: where it goes, what to ask for, and why it may be impossible."""

    item_id: str
    path: str
    prompt: str
    caption: str
    seed_parts: Sequence[Any] = ()
    blocked: str | None = None
    record: Mapping[str, Any] = field(default_factory=dict)
    # The upstream pictures this one is drawn from (recorded: the dependents of a redraw).
    sources: Sequence[ItemSource] = ()

    @property
    def seed(self) -> str:
        """Content hash of everything the picture depends on: same seed, same picture."""
        return sha256_text(canonical_json([self.item_id, self.prompt, list(self.seed_parts)]))

    @property
    def prompt_seed(self) -> str:
        """Hash of what was asked for, without the upstream pictures it was drawn from."""
        return sha256_text(canonical_json([self.item_id, self.prompt]))


@dataclass
class ImagePlan:
    jobs: list[ImageJob]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def upstream_file(
    ctx: VerifyContext, step_id: str, entry: Mapping[str, Any] | None
) -> tuple[str, str] | None:
    """(path, sha256) of a reference image another step recorded, if its bytes still match."""
    if not entry or not isinstance(entry.get("path"), str):
        return None
    key = StepKey(ctx.key.project_id, ctx.key.episode_id, step_id)
    path = ctx.checkpoints.artifact_path(key, entry["path"])
    if not path.is_file() or file_sha256(path) != entry.get("sha256"):
        return None
    return entry["path"], str(entry["sha256"])
