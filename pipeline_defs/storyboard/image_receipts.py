"""An image step's files on disk: each picture with its receipt beside it.

A receipt (``<picture>.receipt.json``) says what the picture is (the job's seed, its sha256
and size) and which image model drew it. :func:`place` writes a drawn picture and its
receipt to the run's private ``.staging/`` directory and moves both into place under the
ledger row lock (``StepContext.fenced``, docs/DESIGN.md#fencing), archiving what they
replace; :func:`reuse_receipt` takes back a picture a (possibly killed) earlier run placed,
while its receipt still vouches for it; :func:`drawn_by_another_model` says when a receipt
names another model. Every file is reached through the checkpoint store, which refuses a
symlink on the way or in place.
"""

import contextlib
import json
import os
from pathlib import Path

from pipeline_defs.resume.files import file_sha256, fsync_dir, read_nofollow
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.steps.context import StepContext
from pipeline_defs.storyboard.image_jobs import ImageJob
from resources.checkpoints.atomic import atomic_write_bytes
from resources.checkpoints.envelope import Artifact, canonical_json, sha256_text

RECEIPT_SUFFIX = ".receipt.json"


def archive_invalid(ctx: StepContext, job: ImageJob, *, receipt: bool = False) -> None:
    """Move a present PNG (and for a redraw its receipt) aside before drawing it again:
    nothing is lost."""
    ctx.checkpoints.archive_artifact(ctx.key, job.path)
    if receipt:
        ctx.checkpoints.archive_artifact(ctx.key, job.path + RECEIPT_SUFFIX)


def receipt_path(ctx: StepContext, job: ImageJob) -> Path:
    return ctx.artifact_path(job.path + RECEIPT_SUFFIX)


def staging_dir(ctx: StepContext) -> str:
    """The run's private directory under the step dir (relative), named by its owner."""
    return DataLayout.run_staging(sha256_text(ctx.run_id or "no-run")[:16])


def place(ctx: StepContext, job: ImageJob, png: bytes, model: str, *, redraw: bool) -> Artifact:
    """Write the PNG and its receipt (what it is, which model drew it) privately, then
    move both into place, archiving what they replace, under the ledger row lock
    (docs/DESIGN.md#fencing): a worker whose lease was taken over never replaces nor
    archives a file the new owner published. The pair lands right after the call, so a
    run killed before it publishes its checkpoint still leaves reusable work behind."""
    staging = staging_dir(ctx)
    staged = ctx.write_artifact(f"{staging}/{job.path}", png)
    artifact = Artifact(path=job.path, sha256=staged.sha256, bytes=staged.bytes)
    receipt = {"seed": job.seed, "sha256": staged.sha256, "bytes": staged.bytes, "model": model}
    receipt_file = job.path + RECEIPT_SUFFIX
    atomic_write_bytes(
        ctx.artifact_path(f"{staging}/{receipt_file}"), canonical_json(receipt).encode()
    )

    def into_place() -> None:
        archive_invalid(ctx, job, receipt=redraw)
        for relative in (job.path, receipt_file):
            target = ctx.artifact_path(relative)  # refuses a link on the way or in place
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(ctx.artifact_path(f"{staging}/{relative}"), target)
        fsync_dir(ctx.artifact_path(job.path).parent)

    ctx.fenced(into_place)
    return artifact


def drop_staging(ctx: StepContext) -> None:
    """Remove the run's staging directories once empty; a file left there (a write the
    fence refused) stays: nothing is deleted."""
    root = ctx.artifact_path(staging_dir(ctx))
    if not root.is_dir():
        return
    for folder, _dirs, _files in os.walk(root, topdown=False):  # links are not followed
        with contextlib.suppress(OSError):
            os.rmdir(folder)
    with contextlib.suppress(OSError):
        os.rmdir(root.parent)


def reuse_receipt(ctx: StepContext, job: ImageJob) -> Artifact | None:
    try:
        receipt = json.loads(read_nofollow(receipt_path(ctx, job)))
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


def drawn_by_another_model(ctx: StepContext, job: ImageJob) -> bool:
    """Its receipt names a model other than the one this run draws with (receipts
    written before models were recorded name none, and count as this model's)."""
    current = ctx.providers.image_model_name
    if current is None:
        return False
    try:
        receipt = json.loads(read_nofollow(receipt_path(ctx, job)))
    except (OSError, ValueError):
        return False
    drawn_by = receipt.get("model") if isinstance(receipt, dict) else None
    return drawn_by is not None and drawn_by != current
