"""A file that is not what the published checkpoint records is a block, never re-run over
an older copy of a redrawn picture put back from the archive, and a
tampered or hash-less checkpoint left by a failed or partial run.

Real Dagster runs of the storyboard steps (offline models), a real redraw, real copies
of the archived files, real outages of the image model; on both ledgers.
"""

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from storyboard_support import Env

from pipeline_defs.resume.completion import CompletionReport, Origin
from pipeline_defs.resume.decision import decide
from pipeline_defs.resume.decision_types import (
    CheckpointSummary,
    LaunchMode,
    ResumeAction,
    ScopedConfig,
)
from pipeline_defs.resume.layout import ARCHIVE_DIR
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow, StepStatus
from pipeline_defs.steps.redraw import REDRAW_TAG
from resources.providers import ImageCall, ImageReply, OfflineImageModel
from resources.providers.base import RETRIES_EXHAUSTED, provider_error

# ----------------------------------------------------------------------------- homes
BACKENDS = ("sqlite", "postgresql")  # ``built`` and ``env`` (tests/conftest.py)


class OutageImageModel(OfflineImageModel):
    """Offline images, except calls whose caption mentions ``fail_on`` (an outage)."""

    fail_on: str

    def generate(self, call: ImageCall) -> ImageReply:
        if self.fail_on in call.caption:
            raise provider_error(RETRIES_EXHAUSTED, f"simulated outage for {self.fail_on}")
        return super().generate(call)


# ----------------------------------------------------------------------------- (d)
def test_an_older_copy_put_back_after_a_redraw_blocks_naming_the_file(env: Env) -> None:
    """Before: the archived C01.png and its receipt, copied back after ``redraw --item
    C01``, were adopted silently (rerun_self, 0 calls): the receipt vouched for them."""
    step = "ref_image_gen"
    target = env.step_dir(step) / "refs" / "C01.png"
    receipt = target.with_name("C01.png.receipt.json")
    old = target.read_bytes()
    redrawn = env.materialize([step], tags={REDRAW_TAG: "C01"})
    assert redrawn.calls_of(step) == 1 and target.read_bytes() != old
    published = env.checkpoint(step)
    assert published is not None

    # The operator puts the old picture back from the archive, receipt included.
    archive = env.step_dir(step) / ARCHIVE_DIR
    [png_copy] = [p for p in archive.iterdir() if p.name.endswith("-C01.png")]
    [receipt_copy] = [p for p in archive.iterdir() if p.name.endswith("-C01.png.receipt.json")]
    shutil.copy2(png_copy, target)
    shutil.copy2(receipt_copy, receipt)
    assert target.read_bytes() == old

    decision = env.judge(step)
    assert decision.action is ResumeAction.BLOCK, decision
    assert decision.origin is Origin.INVARIANT_DRIFT
    assert "refs/C01.png" in decision.reason and "sha256 mismatch" in decision.reason

    outcome = env.materialize(raise_on_error=False)
    assert outcome.decisions[step] == "block"
    assert outcome.total_calls == 0
    kept = env.checkpoint(step)
    assert kept is not None and kept.content_hash == published.content_hash  # not adopted
    assert target.read_bytes() == old  # left in place, for the operator to decide


def test_an_older_copy_put_back_on_a_partial_row_blocks_too(env: Env) -> None:
    """A partial row is re-run without verifying: before, the receipt of the older copy
    vouched for it and the re-run adopted it (0 calls for it)."""
    step = "composite_image_gen"
    target = env.step_dir(step) / "composites" / "C02_O01.png"
    receipt = target.with_name("C02_O01.png.receipt.json")
    old = target.read_bytes()
    outage = env.materialize(
        [step],
        tags={REDRAW_TAG: "all"},
        image_model=OutageImageModel(fail_on="C01_O02"),
        raise_on_error=False,
    )
    assert outage.calls_of(step) == 3
    row = env.row(step)
    assert row is not None and row.status == "partial"
    assert target.read_bytes() != old
    published = env.checkpoint(step)
    assert published is not None

    archive = env.step_dir(step) / ARCHIVE_DIR
    [png_copy] = [p for p in archive.iterdir() if p.name.endswith("-C02_O01.png")]
    [receipt_copy] = [p for p in archive.iterdir() if p.name.endswith("-C02_O01.png.receipt.json")]
    shutil.copy2(png_copy, target)
    shutil.copy2(receipt_copy, receipt)

    decision = env.judge(step)
    assert decision.action is ResumeAction.BLOCK, decision
    assert decision.origin is Origin.INVARIANT_DRIFT
    assert str(target) in decision.reason and "older copy" in decision.reason

    outcome = env.materialize(raise_on_error=False)
    assert outcome.decisions[step] == "block"
    assert outcome.calls_of(step) == 0
    kept = env.checkpoint(step)
    assert kept is not None and kept.content_hash == published.content_hash
    assert target.read_bytes() == old


# ----------------------------------------------------------------------------- (e)
def _hashless(path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    del raw["content_hash"]
    path.write_text(json.dumps(raw), encoding="utf-8")


def _edited(path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["data"]["edited_by"] = "hand"  # the stored content_hash no longer fits
    path.write_text(json.dumps(raw), encoding="utf-8")


TAMPERS: dict[str, Callable[[Path], None]] = {"hashless": _hashless, "edited": _edited}
# (step, the item an outage hits during a redraw of all its items, the row status it leaves)
OUTAGES = {
    "partial": ("composite_image_gen", "C01_O02"),
    "failed": ("ref_image_gen", "reference sheet"),
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
@pytest.mark.parametrize("status", sorted(OUTAGES))
def test_a_tampered_checkpoint_on_an_unfinished_row_blocks(
    env: Env, status: str, tamper: str
) -> None:
    """Before: a failed or partial row was re-run over a tampered or hash-less checkpoint
    (rerun_self "auto recovery"), which a completed row blocks."""
    step, fail_on = OUTAGES[status]
    outage = env.materialize(
        [step],
        tags={REDRAW_TAG: "all"},
        image_model=OutageImageModel(fail_on=fail_on),
        raise_on_error=False,
    )
    assert outage.calls_of(step) > 0
    row = env.row(step)
    assert row is not None and row.status == status
    path = env.checkpoint_path(step)
    TAMPERS[tamper](path)
    tampered = path.read_bytes()

    decision = env.judge(step)
    assert decision.action is ResumeAction.BLOCK, decision
    assert decision.origin in (Origin.CONTRACT_DRIFT, Origin.INVARIANT_DRIFT)
    assert str(path) in decision.reason

    outcome = env.materialize(raise_on_error=False)
    assert outcome.decisions[step] == "block"
    assert outcome.calls_of(step) == 0
    assert path.read_bytes() == tampered  # the evidence stays where it was
    row = env.row(step)
    assert row is not None and row.status == status


# ----------------------------------------------------------------------------- the table
@dataclass(frozen=True)
class _Step:
    step_id: str = "alpha"
    schema_version: int = 1
    resume_config_keys: tuple[str, ...] = ()
    allow_auto_rerun_on_schema_bump: bool = False


@pytest.mark.parametrize("status", ["failed", "partial", "stale", "pending"])
@pytest.mark.parametrize("unusable", [True, False])
def test_the_table_judges_an_unusable_checkpoint_as_on_a_completed_row(
    status: str, unusable: bool
) -> None:
    """``decide`` (pure): row 11 re-runs a settled row only over a usable checkpoint; an
    unusable one (how the judge summarizes a load error) goes to row 10 and blocks."""
    config = ScopedConfig()
    tampered = "checkpoint /h/alpha/checkpoint.json: content hash a does not match (b)"
    decision = decide(
        mode=LaunchMode.RESUME,
        applicable=True,
        row=LedgerRow(status=status, run_id="r:0", recovery_count=0),
        checkpoint=CheckpointSummary(
            present=True,
            schema_version=1,
            status=StepStatus.COMPLETED,
            config_hash=config.hash,
            unusable=unusable,
        ),
        verify=lambda: CompletionReport.incomplete(Origin.INVARIANT_DRIFT, (tampered,)),
        step=_Step(),
        config=config,
        settings=ResumeSettings(),
        now=datetime(2026, 12, 1, tzinfo=UTC),
    )
    if unusable:
        assert (decision.action, decision.origin) == (ResumeAction.BLOCK, Origin.INVARIANT_DRIFT)
        assert tampered in decision.reason
    else:
        assert decision.action is ResumeAction.RERUN_SELF and decision.auto_recovery
