"""Read-only by type: what the judge, a verifier's context and batch judgement hold are the
stores' readers (``pipeline_defs.steps.readers``), and the readers name no writing method.

mypy (strict, ``make lint``) then refuses any write through them; this pins the types, so
an edit that widens a reader protocol or hands the judge a full store fails here too.
"""

from typing import Any, get_type_hints

import pytest
from typing_extensions import get_protocol_members

from pipeline_defs.judging.evaluation import BatchJudge
from pipeline_defs.judging.stores import ReadStores, Stores
from pipeline_defs.judging.tick import ResumeTicker
from pipeline_defs.steps.context import StepContext, VerifyContext
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.readers import CheckpointReader, LedgerReader
from pipeline_defs.steps.runner import StepRunner
from pipeline_defs.steps.spec import Step
from pipeline_defs.storyboard import STORYBOARD_STEPS
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore

# Exactly what judging reads; widening either set is a decision, made here on purpose.
LEDGER_READS = {"url", "get", "get_many", "cursor", "episode_calls", "episode_estimate"}
CHECKPOINT_READS = {
    "home",
    "layout",
    "scan_layout",
    "poolable",
    "sync_inputs",  # on object storage: a cache of the published inputs (no ledger write)
    "judging_scope",
    "step_dir",
    "path_for",
    "artifact_path",
    "refuse_links_in_tree",
    "with_companions",
    "archived_artifacts",
    "not_regular",
    "episode_input_files",
    "artifact_sha256",
    "load",
    "artifact_problems",
    "sealed",
}
# Writing methods of the full stores: never a reader's.
LEDGER_WRITES = {
    "migrate",
    "claim",
    "adopt",
    "adopt_pointer",
    "mark_not_applicable",
    "transition",
    "publish",
    "clear_seal",
    "with_settled_row",
    "reset_recovery",
    "set_retry_not_before",
    "heartbeat",
    "invalidate",
    "reset_running",
    "append_transition",
    "append_audit",
    "start_provider_call",
    "finish_provider_call",
}
CHECKPOINT_WRITES = {
    "write_artifact",
    "archive_artifact",
    "stage",
    "save",
    "seal",
    "write_pending",
    "drop_pending",
    "archive",
    "force_clear",
    "checkout_edit",
    "publish_inputs",
    "scrub",
}
VERIFY_HOOKS = ("is_applicable", "verify_completion", "verify_reads")


def test_the_reader_protocols_name_exactly_the_reads() -> None:
    assert get_protocol_members(LedgerReader) == LEDGER_READS
    assert get_protocol_members(CheckpointReader) == CHECKPOINT_READS
    assert not LEDGER_READS & LEDGER_WRITES
    assert not CHECKPOINT_READS & CHECKPOINT_WRITES


def test_the_full_stores_are_readers() -> None:
    for name in LEDGER_READS:
        assert hasattr(LedgerStore, name), name
    for name in CHECKPOINT_READS:
        assert hasattr(CheckpointStore, name), name


def test_the_judge_holds_readers() -> None:
    hints = get_type_hints(StepJudge.__init__)
    assert hints["ledger"] is LedgerReader
    assert hints["checkpoints"] is CheckpointReader
    assert get_type_hints(StepJudge.context)["return"] is VerifyContext
    for method in (StepJudge.verify, StepJudge.verifier_reads):
        assert get_type_hints(method)["ctx"] is VerifyContext


def test_a_verifier_context_has_no_writer() -> None:
    hints = get_type_hints(VerifyContext)
    assert hints["ledger"] is LedgerReader
    assert hints["checkpoints"] is CheckpointReader
    for writer in ("write_artifact", "fenced", "providers", "meter", "redraw"):
        assert not hasattr(VerifyContext, writer), writer
        assert writer not in hints, writer
    # the run's context is the one that writes, on the full stores
    full = get_type_hints(StepContext)
    assert full["ledger"] is LedgerStore
    assert full["checkpoints"] is CheckpointStore
    assert hasattr(StepContext, "write_artifact") and hasattr(StepContext, "fenced")


def _ctx_hint(cls: type, name: str) -> Any:
    method = getattr(cls, name)
    names = {"VerifyContext": VerifyContext, "StepContext": StepContext, "Checkpoint": Checkpoint}
    return get_type_hints(method, localns=names)["ctx"]


@pytest.mark.parametrize("hook", VERIFY_HOOKS)
def test_the_verify_hooks_take_the_read_only_context(hook: str) -> None:
    assert _ctx_hint(Step, hook) is VerifyContext
    for step in STORYBOARD_STEPS:
        for cls in type(step).__mro__:  # every override, the step's own and its bases'
            if hook in cls.__dict__:
                assert _ctx_hint(cls, hook) is VerifyContext, (cls.__qualname__, hook)


def test_the_writers_hold_the_full_stores() -> None:
    hints = get_type_hints(StepRunner.__init__)
    assert hints["ledger"] is LedgerStore
    assert hints["checkpoints"] is CheckpointStore
    # batch judgement and the tick take the readers; the sensor's ``Stores`` is one of them
    assert get_type_hints(BatchJudge.__init__)["stores"] is ReadStores
    assert get_type_hints(ResumeTicker.__init__)["stores"] is ReadStores
    assert get_type_hints(ReadStores)["ledger"] is LedgerReader
    assert get_type_hints(ReadStores)["checkpoints"] is CheckpointReader
    assert issubclass(Stores, ReadStores)
