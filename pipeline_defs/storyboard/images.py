"""What the three image steps share: :class:`ImageStep`, which reuses valid images, draws
only the rest and verifies what was drawn. Each step plans its jobs
(:mod:`~pipeline_defs.storyboard.image_jobs`); a picture and its receipt on disk are
:mod:`~pipeline_defs.storyboard.image_receipts`'.

An image step is an upsert per entity/shot. A re-run keeps every existing PNG whose bytes
still match the previous checkpoint's record for the same job (same seed = same prompt
and references), and calls the image model only for what is missing or invalid, so one
lost PNG costs one call. A job whose references are missing is never drawn (no default
or wrong reference): it is counted failed and the step ends partial. ``cleanup_artifacts``
deletes nothing: regenerating one entity must never delete another's image.

Every file is reached through the checkpoint store (``artifact_path``, ``archive_artifact``,
``write_artifact``), which refuses a symlink on the way or in place (``checkpoint.symlink``,
docs/DESIGN.md#no-escape); a step dir holding a link fails before any provider call. A drawn PNG and
its receipt are written to the run's private ``.staging/`` directory and moved into place
under the ledger row lock (``StepContext.fenced``, ``image_receipts.place``): a worker that
lost its lease cannot replace or archive what the step's new owner published.
"""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pipeline_defs.project import scoped_fingerprints
from pipeline_defs.resume.completion import CompletionReport, Origin, Severity
from pipeline_defs.resume.decision_types import config_hash
from pipeline_defs.resume.errors import BudgetExhausted, PipelineError, SymlinkRefused
from pipeline_defs.resume.files import file_sha256, read_nofollow
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.context import StepContext, VerifyContext
from pipeline_defs.steps.judge import not_a_file
from pipeline_defs.steps.spec import CleanupReport, ItemSource, Markdown, Step, StepResult
from pipeline_defs.storyboard.contact_sheet import (
    ItemAction,
    SheetItem,
    build_contact_sheet,
    thumbnail,
)
from pipeline_defs.storyboard.image_jobs import ImageJob, ImagePlan
from pipeline_defs.storyboard.image_receipts import (
    RECEIPT_SUFFIX,
    drawn_by_another_model,
    drop_staging,
    place,
    reuse_receipt,
)
from resources.checkpoints.envelope import Artifact, Checkpoint, canonical_json, sha256_text
from resources.providers import PNG_SIGNATURE, ImageCall

MAX_LISTED = 20


class ImageStep(Step):
    """Base of the image steps: subclasses only say which jobs exist (``plan``)."""

    kind: str = "image"
    # A PNG whose bytes are not the ones its checkpoint records blocks, naming the file, as
    # an edited envelope does: an
    # older copy put back from the archive comes with a receipt that vouches for it, and a
    # re-run would adopt it without a word. Only an absent PNG is re-run (one call).
    changed_artifact_origin = Origin.INVARIANT_DRIFT
    # Tag resume/redraw names items by the ids of ``expected`` (the PNG names).
    redrawable = True

    def plan(self, ctx: VerifyContext, inputs: Mapping[str, Checkpoint]) -> ImagePlan:
        """The pictures this step is to have, from its inputs (a run draws them; the
        verifier compares what was drawn with what is asked for now)."""
        raise NotImplementedError

    def verify_reads(self, ctx: VerifyContext) -> tuple[Path, ...]:
        """The checkpoints the prompts come from: a verdict on whether each picture was drawn
        from the prompt asked for now depends on them (an accepted or reviewed edit)."""
        return tuple(
            ctx.checkpoints.path_for(StepKey(ctx.key.project_id, ctx.key.episode_id, dep))
            for dep in self.deps
        )

    def items_from_older_prompts(
        self, ctx: VerifyContext, checkpoint: Checkpoint
    ) -> tuple[str, ...]:
        """The pictures of ``checkpoint`` drawn from a prompt other than the one their job
        asks for now (an edit of an upstream prompt, accepted or made by the review); a
        re-run redraws exactly those (their seed changed) and keeps every other. Nothing
        when an input cannot be read or planned (other verdicts say why)."""
        inputs: dict[str, Checkpoint] = {}
        for dep in self.deps:
            try:
                upstream = ctx.upstream(dep)
            except PipelineError:
                return ()
            if upstream is None:
                return ()
            inputs[dep] = upstream
        try:
            jobs = self.plan(ctx, inputs).jobs
        except (KeyError, TypeError, ValueError, AttributeError, PipelineError):
            return ()
        images = checkpoint.data.get("images") or {}
        out = []
        for job in jobs:
            entry = images.get(job.item_id)
            if not isinstance(entry, Mapping) or entry.get("prompt_seed") is None:
                continue  # not drawn (the verdict above says so), or a record of before
            if entry["prompt_seed"] != job.prompt_seed:
                out.append(job.item_id)
        return tuple(out)

    def _previous(self, ctx: StepContext) -> Checkpoint | None:
        try:
            return ctx.upstream(self.step_id)
        except SymlinkRefused:
            raise  # not "corrupt": a link in our directory stops the step
        except PipelineError:
            return None  # a corrupt previous checkpoint offers nothing to reuse

    def cleanup_artifacts(self, ctx: StepContext) -> CleanupReport:
        """Deletes nothing (see the module doc); refuses a link anywhere in the step's
        directory before an explicit force invalidates anything downstream."""
        ctx.checkpoints.refuse_links_in_tree(ctx.key)
        return CleanupReport(note="nothing deleted: images are upserted, never cleaned")

    def redraw_items(self, checkpoint: Checkpoint) -> tuple[str, ...]:
        return tuple(str(i) for i in checkpoint.data.get("expected") or [])

    def item_sources(self, checkpoint: Checkpoint) -> Mapping[str, tuple[ItemSource, ...]]:
        out: dict[str, tuple[ItemSource, ...]] = {}
        for item, entry in (checkpoint.data.get("images") or {}).items():
            listed = entry.get("sources") if isinstance(entry, Mapping) else None
            out[str(item)] = tuple(
                ItemSource(str(s["step"]), str(s["item"]), str(s["sha256"]))
                for s in listed or []
                if isinstance(s, Mapping)
            )
        return out

    def _reuse(
        self,
        ctx: StepContext,
        previous: Checkpoint | None,
        job: ImageJob,
        recalled: Checkpoint | None = None,
    ) -> Artifact | None:
        """A valid existing PNG for this exact job: from the last checkpoint, else from the
        receipt a (possibly killed) earlier run wrote beside it, else (object storage) from
        the checkpoint a force archived (:meth:`_recalled`). A picture another image model
        drew is not reused: after the project switches models (a scoped config change,
        which blocks), the operator's force asks for pictures by the new one."""
        if drawn_by_another_model(ctx, job):
            return None
        return (
            self._reuse_published(ctx, previous, job)
            or reuse_receipt(ctx, job)
            or self._reuse_published(ctx, recalled, job)
        )

    def _recalled(self, ctx: StepContext, previous: Checkpoint | None) -> Checkpoint | None:
        """What the step published before a force archived it, its pictures brought back
        where ``_reuse_published`` looks (object storage: a new process's copy of the step
        starts empty, where a local home keeps every picture beside its receipt). Only a
        checkpoint drawn under this step's configuration as it is now: the receipts that
        vouch for a picture's model on disk do not travel, the image model is one of the
        scoped keys, so a model switch recalls nothing."""
        if previous is not None:
            return None
        recalled = ctx.checkpoints.recall(ctx.key)
        if recalled is None:
            return None
        now = config_hash(scoped_fingerprints(ctx.project.as_dict(), self.resume_config_keys))
        return recalled if recalled.config_hash == now else None

    def _kept_outdated(
        self, ctx: StepContext, previous: Checkpoint | None, job: ImageJob
    ) -> tuple[Artifact, Mapping[str, Any]] | None:
        """A valid published picture asked for with the same prompt, from the same upstream
        items, one of which has been redrawn since: kept with its record (what it was
        really built from), reported as outdated, redrawn only when asked."""
        if previous is None:
            return None
        entry = (previous.data.get("images") or {}).get(job.item_id)
        artifact = previous.artifact(job.path)
        if not isinstance(entry, Mapping) or artifact is None:
            return None
        if entry.get("prompt_seed") != job.prompt_seed or entry.get("path") != job.path:
            return None
        built_from = [(s.step_id, s.item_id) for s in self.item_sources(previous)[job.item_id]]
        if not built_from or built_from != [(s.step_id, s.item_id) for s in job.sources]:
            return None
        path = ctx.artifact_path(job.path)
        if entry.get("sha256") != artifact.sha256 or not path.is_file():
            return None
        if path.stat().st_size != artifact.bytes or file_sha256(path) != artifact.sha256:
            return None
        return artifact, entry

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

    @staticmethod
    def _replaced_thumbnail(ctx: StepContext, job: ImageJob) -> bytes | None:
        """The thumbnail of the picture a redraw is about to replace (archived when the new
        one is placed), for the contact sheet; None if there is none to read."""
        try:
            png = read_nofollow(ctx.artifact_path(job.path))
        except (OSError, PipelineError):
            return None
        return thumbnail(png, name=f"{job.item_id} (replaced)")

    @staticmethod
    def _picture(ctx: StepContext, job: ImageJob) -> Callable[[], bytes]:
        """Reads the item's placed PNG when the contact sheet shows it (not before: an
        episode may have more pictures than the sheet holds)."""
        path = ctx.artifact_path(job.path)
        return lambda: read_nofollow(path)

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        # Before any provider call: a link in our directory would fail the run only after
        # paying for images (when the first PNG or receipt is written).
        ctx.checkpoints.refuse_links_in_tree(ctx.key)
        plan = self.plan(ctx, inputs)
        # Likewise a directory or a FIFO where a picture or its receipt goes: the move into
        # place would fail after the call (a FIFO would be replaced, or hang a read). The
        # judge blocks on the files the checkpoint lists; this covers every job of the plan.
        in_the_way = not_a_file(
            ctx.checkpoints,
            ctx.key,
            [p for job in plan.jobs for p in (job.path, job.path + RECEIPT_SUFFIX)],
            f"a picture of {self.step_id} or its receipt",
        )
        if in_the_way is not None:
            raise in_the_way
        previous = self._previous(ctx)
        recalled = self._recalled(ctx, previous)
        size = ctx.project.image
        images: dict[str, dict[str, Any]] = {}
        failed: list[dict[str, Any]] = []
        artifacts: list[Artifact] = []
        drawn = reused = redrawn = outdated = 0
        sheet: list[SheetItem] = []
        for job in plan.jobs:
            if job.blocked:
                failed.append({"item_id": job.item_id, "reason": job.blocked})
                sheet.append(
                    SheetItem(job.item_id, ItemAction.FAILED, job.prompt, note=job.blocked)
                )
                continue
            redrawing = job.item_id in ctx.redraw
            # A redraw asks for a new picture of the same job: the call's seed differs per
            # run (the offline model is deterministic per seed); the receipt keeps the
            # job's seed, so a resume after a crash reuses what this run drew.
            artifact = None if redrawing else self._reuse(ctx, previous, job, recalled)
            kept = (
                None
                if redrawing or artifact or drawn_by_another_model(ctx, job)
                else self._kept_outdated(ctx, previous, job)
            )
            if kept is not None:
                artifact = kept[0]
                outdated += 1
            if artifact is None:
                seed = (
                    sha256_text(canonical_json([job.seed, "redraw", ctx.run_id]))
                    if redrawing
                    else job.seed
                )
                # Read before the new picture is placed: placing archives the old one.
                replaced = self._replaced_thumbnail(ctx, job) if redrawing else None
                call = ImageCall(job.prompt, job.caption, size.width, size.height, seed)
                try:
                    reply = ctx.providers.image(call)
                except BudgetExhausted:
                    # No item can be drawn past the cap: the step fails on it (what it
                    # drew is placed with its receipt and reused when it resumes).
                    raise
                except PipelineError as exc:
                    reason = f"[{exc.code}] {exc.message}"
                    failed.append({"item_id": job.item_id, "reason": reason})
                    sheet.append(SheetItem(job.item_id, ItemAction.FAILED, job.prompt, note=reason))
                    continue
                if not reply.png.startswith(PNG_SIGNATURE):
                    reason = "provider returned no PNG"
                    failed.append({"item_id": job.item_id, "reason": reason})
                    sheet.append(SheetItem(job.item_id, ItemAction.FAILED, job.prompt, note=reason))
                    continue
                artifact = place(ctx, job, reply.png, reply.model, redraw=redrawing)
                drawn += 1
                redrawn += redrawing
                action = ItemAction.REDREW if redrawing else ItemAction.DREW
                picture = self._picture(ctx, job)
                sheet.append(
                    SheetItem(job.item_id, action, job.prompt, picture=picture, replaced=replaced)
                )
            else:
                reused += 1
                action = ItemAction.KEPT_OUTDATED if kept is not None else ItemAction.REUSED
                picture = self._picture(ctx, job)
                sheet.append(SheetItem(job.item_id, action, job.prompt, picture=picture))
            artifacts.append(artifact)
            if kept is not None:
                images[job.item_id] = dict(kept[1])
                continue
            images[job.item_id] = {
                "path": job.path,
                "sha256": artifact.sha256,
                "seed": job.seed,
                "prompt_seed": job.prompt_seed,
                **job.record,
            }
            if job.sources:
                images[job.item_id]["sources"] = [
                    {"step": s.step_id, "item": s.item_id, "sha256": s.sha256} for s in job.sources
                ]
        drop_staging(ctx)
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
                "redrawn": redrawn,
                "kept_outdated": outdated,
                "failed": len(failed),
                "skipped": len(plan.skipped),
                # Built only by a run that executes: a SKIP re-emits no pictures.
                "contact_sheet": Markdown(
                    build_contact_sheet(f"{self.step_id} contact sheet", sheet).markdown
                ),
            },
        )

    def verify_completion(self, ctx: VerifyContext, checkpoint: Checkpoint) -> CompletionReport:
        """Expected set vs files present with matching sha256: an absent one is missing (a
        re-run draws it), one with other bytes is drift (a block naming it, see
        ``changed_artifact_origin``)."""
        expected = [str(i) for i in checkpoint.data.get("expected") or []]
        images = checkpoint.data.get("images") or {}
        missing: list[str] = []
        changed: list[str] = []
        for item in expected:
            entry = images.get(item)
            if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
                missing.append(f"{item} (no image)")
                continue
            path = ctx.artifact_path(entry["path"])
            if not path.is_file():
                missing.append(f"{entry['path']} (missing)")
            elif file_sha256(path) != entry.get("sha256"):
                changed.append(f"{entry['path']} (sha256 mismatch)")
        if changed:
            return CompletionReport.incomplete(
                Origin.INVARIANT_DRIFT,
                tuple([*changed, *missing][:MAX_LISTED]),
                Severity.PARTIAL,
                missing_count=len(missing) + len(changed),
            )
        if missing:
            severity = Severity.MISSING if len(missing) >= len(expected) else Severity.PARTIAL
            return CompletionReport.incomplete(
                Origin.ARTIFACT_MISSING,
                tuple(missing[:MAX_LISTED]),
                severity,
                missing_count=len(missing),
            )
        # A picture for the prompt asked for now is missing too: redrawn, one call each.
        outdated = [
            f"{images[item]['path']} (drawn from an older prompt)"
            for item in self.items_from_older_prompts(ctx, checkpoint)
        ]
        if outdated:
            return CompletionReport.incomplete(
                Origin.INPUT_CHANGED,
                tuple(outdated[:MAX_LISTED]),
                Severity.PARTIAL,
                missing_count=len(outdated),
            )
        return CompletionReport.clean(images=len(expected))
