"""What the three image steps share: plan jobs, reuse valid images, draw only the rest.

An image step is an upsert per entity/shot. A re-run keeps every existing PNG whose bytes
still match the previous checkpoint's record for the same job (same seed = same prompt
and references), and calls the image model only for what is missing or invalid, so one
lost PNG costs one call. A job whose references are missing is never drawn (no default
or wrong reference): it is counted failed and the step ends partial. ``cleanup_artifacts``
deletes nothing: regenerating one entity must never delete another's image.

Every file is reached through the checkpoint store (``artifact_path``, ``archive_artifact``,
``write_artifact``), which refuses a symlink on the way or in place (``checkpoint.symlink``,
SPEC §11); a step directory holding a link fails before any provider call.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline_defs.resume.completion import CompletionReport, Origin, Severity
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.context import StepContext
from pipeline_defs.steps.spec import CleanupReport, Step, StepResult
from resources.checkpoints.envelope import Artifact, Checkpoint, canonical_json, sha256_text
from resources.checkpoints.store import (
    SYMLINK_CODE,
    atomic_write_bytes,
    file_sha256,
    read_nofollow,
)
from resources.providers import PNG_SIGNATURE, ImageCall

MAX_LISTED = 20
RECEIPT_SUFFIX = ".receipt.json"


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

    @property
    def seed(self) -> str:
        """Content hash of everything the picture depends on: same seed, same picture."""
        return sha256_text(canonical_json([self.item_id, self.prompt, list(self.seed_parts)]))


@dataclass
class ImagePlan:
    jobs: list[ImageJob]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def upstream_file(
    ctx: StepContext, step_id: str, entry: Mapping[str, Any] | None
) -> tuple[str, str] | None:
    """(path, sha256) of a reference image another step recorded, if its bytes still match."""
    if not entry or not isinstance(entry.get("path"), str):
        return None
    key = StepKey(ctx.key.project_id, ctx.key.episode_id, step_id)
    path = ctx.checkpoints.artifact_path(key, entry["path"])
    if not path.is_file() or file_sha256(path) != entry.get("sha256"):
        return None
    return entry["path"], str(entry["sha256"])


class ImageStep(Step):
    """Base of the image steps: subclasses only say which jobs exist (``plan``)."""

    kind: str = "image"
    # A PNG whose bytes changed is redrawn (issue 4 §6), after archiving the changed file.
    changed_artifact_origin = Origin.ARTIFACT_MISSING

    def plan(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> ImagePlan:
        raise NotImplementedError

    def _previous(self, ctx: StepContext) -> Checkpoint | None:
        try:
            return ctx.upstream(self.step_id)
        except PipelineError as exc:
            if exc.code == SYMLINK_CODE:
                raise  # not "corrupt": a link in our directory stops the step
            return None  # a corrupt previous checkpoint offers nothing to reuse

    def cleanup_artifacts(self, ctx: StepContext) -> CleanupReport:
        """Deletes nothing (see the module doc); refuses a link anywhere in the step's
        directory before an explicit force invalidates anything downstream."""
        ctx.checkpoints.refuse_links_in_tree(ctx.key)
        return CleanupReport(note="nothing deleted: images are upserted, never cleaned")

    @staticmethod
    def _archive_invalid(ctx: StepContext, job: ImageJob) -> None:
        """Move a present-but-invalid PNG aside before redrawing: nothing is lost."""
        ctx.checkpoints.archive_artifact(ctx.key, job.path)

    @staticmethod
    def _receipt_path(ctx: StepContext, job: ImageJob) -> Path:
        return ctx.artifact_path(job.path + RECEIPT_SUFFIX)

    def _write_receipt(self, ctx: StepContext, job: ImageJob, artifact: Artifact) -> None:
        """Record what a drawn PNG is, right after it lands, so a run killed before it
        publishes its checkpoint still leaves reusable work behind."""
        receipt = {"seed": job.seed, "sha256": artifact.sha256, "bytes": artifact.bytes}
        atomic_write_bytes(self._receipt_path(ctx, job), canonical_json(receipt).encode())

    def _reuse_receipt(self, ctx: StepContext, job: ImageJob) -> Artifact | None:
        try:
            receipt = json.loads(read_nofollow(self._receipt_path(ctx, job)))
        except (OSError, ValueError):
            return None
        if not isinstance(receipt, dict) or receipt.get("seed") != job.seed:
            return None
        path = ctx.artifact_path(job.path)
        if not path.is_file() or path.stat().st_size != receipt.get("bytes"):
            return None
        if file_sha256(path) != receipt.get("sha256"):
            return None
        return Artifact(path=job.path, sha256=str(receipt["sha256"]), bytes=int(receipt["bytes"]))

    def _reuse(
        self, ctx: StepContext, previous: Checkpoint | None, job: ImageJob
    ) -> Artifact | None:
        """A valid existing PNG for this exact job: from the last checkpoint, else from the
        receipt a (possibly killed) earlier run wrote beside it."""
        return self._reuse_published(ctx, previous, job) or self._reuse_receipt(ctx, job)

    def _reuse_published(
        self, ctx: StepContext, previous: Checkpoint | None, job: ImageJob
    ) -> Artifact | None:
        if previous is None:
            return None
        entry = (previous.data.get("images") or {}).get(job.item_id)
        artifact = previous.artifact(job.path)
        if not entry or artifact is None or entry.get("seed") != job.seed:
            return None
        if entry.get("path") != job.path or entry.get("sha256") != artifact.sha256:
            return None
        path = ctx.artifact_path(job.path)
        if not path.is_file() or path.stat().st_size != artifact.bytes:
            return None
        return artifact if file_sha256(path) == artifact.sha256 else None

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        # Before any provider call: a link in our directory would fail the run only after
        # paying for images (when the first PNG or receipt is written).
        ctx.checkpoints.refuse_links_in_tree(ctx.key)
        plan = self.plan(ctx, inputs)
        previous = self._previous(ctx)
        size = ctx.project.image
        images: dict[str, dict[str, Any]] = {}
        failed: list[dict[str, Any]] = []
        artifacts: list[Artifact] = []
        drawn = reused = 0
        for job in plan.jobs:
            if job.blocked:
                failed.append({"item_id": job.item_id, "reason": job.blocked})
                continue
            artifact = self._reuse(ctx, previous, job)
            if artifact is None:
                call = ImageCall(job.prompt, job.caption, size.width, size.height, job.seed)
                try:
                    reply = ctx.providers.image(call)
                except PipelineError as exc:
                    failed.append({"item_id": job.item_id, "reason": f"[{exc.code}] {exc.message}"})
                    continue
                if not reply.png.startswith(PNG_SIGNATURE):
                    failed.append({"item_id": job.item_id, "reason": "provider returned no PNG"})
                    continue
                self._archive_invalid(ctx, job)
                artifact = ctx.write_artifact(job.path, reply.png)
                self._write_receipt(ctx, job, artifact)
                drawn += 1
            else:
                reused += 1
            artifacts.append(artifact)
            images[job.item_id] = {
                "path": job.path,
                "sha256": artifact.sha256,
                "seed": job.seed,
                **job.record,
            }
        data = {
            **plan.extra,
            "expected": [job.item_id for job in plan.jobs],
            "images": images,
            "failed": failed,
            "skipped": plan.skipped,
        }
        return StepResult(
            data=data,
            applicable_count=len(plan.jobs),
            failed_count=len(failed),
            artifacts=tuple(artifacts),
            summary=f"{len(images)}/{len(plan.jobs)} {self.kind} images ({drawn} drawn, "
            f"{reused} kept), {len(failed)} failed, {len(plan.skipped)} skipped",
            metadata={
                "drawn": drawn,
                "reused": reused,
                "failed": len(failed),
                "skipped": len(plan.skipped),
            },
        )

    def verify_completion(self, ctx: StepContext, checkpoint: Checkpoint) -> CompletionReport:
        """Expected set vs files present with matching sha256; anything else is missing."""
        expected = [str(i) for i in checkpoint.data.get("expected") or []]
        images = checkpoint.data.get("images") or {}
        missing: list[str] = []
        for item in expected:
            entry = images.get(item)
            if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
                missing.append(f"{item} (no image)")
                continue
            path = ctx.artifact_path(entry["path"])
            if not path.is_file():
                missing.append(f"{entry['path']} (missing)")
            elif file_sha256(path) != entry.get("sha256"):
                missing.append(f"{entry['path']} (sha256 mismatch)")
        if missing:
            severity = Severity.MISSING if len(missing) >= len(expected) else Severity.PARTIAL
            return CompletionReport.incomplete(
                Origin.ARTIFACT_MISSING,
                tuple(missing[:MAX_LISTED]),
                severity,
                missing_count=len(missing),
            )
        return CompletionReport.clean(images=len(expected))
