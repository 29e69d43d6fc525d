"""Paid once: the journal of paid replies (docs/DESIGN.md#reply-journal).

A reply is kept in the shared store the moment it arrives; a later attempt of the same work
takes it back instead of paying for it again, on each ledger and on a bucket (an image
step's pictures are also kept by its own partial publish; its kills are in the crash
matrix). Only a
verified entry of the very same request is taken back; a force, a redraw and a reply the
step refused start new work, which pays.
"""

import hashlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from storyboard_support import Env

from pipeline_defs.project import ProviderConfig
from pipeline_defs.resume.decision_types import LaunchMode
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.journal import (
    JOURNAL,
    JournalCollection,
    KeptReply,
    ReplyJournal,
    journal_prefix,
    request_digest,
)
from resources.providers import (
    ImageCall,
    ImageReply,
    OfflineImageModel,
    OfflineTextModel,
    TextCall,
    TextModel,
    TextReply,
)
from resources.providers.base import HTTP_ERROR, provider_error
from resources.storage.local import LocalStorage
from resources.storage_garbage import collect_unnamed

BACKENDS = ("sqlite", "postgresql", "s3")


class Faltering:
    """The offline models, failing one call (``fail_at``, counted from 1) as an endpoint
    that answered 502 would, or answering it with a reply the step must refuse."""

    def __init__(self, fail_at: int, *, malformed: bool = False) -> None:
        self.fail_at = fail_at
        self.malformed = malformed
        self.calls = 0
        self.text = OfflineTextModel()
        self.images = OfflineImageModel()

    @property
    def model_name(self) -> str:
        return self.text.model_name

    def for_provider(self, provider: ProviderConfig) -> "Faltering":
        return self

    def preflight(self) -> None:
        pass

    def _fault(self) -> bool:
        self.calls += 1
        if self.calls != self.fail_at:
            return False
        if not self.malformed:
            raise provider_error(HTTP_ERROR, "the endpoint answered 502 Bad Gateway")
        return True

    def complete(self, call: TextCall) -> TextReply:
        if self._fault():
            return TextReply({"unexpected": True}, 5, self.text.model_name)
        return self.text.complete(call)

    def generate(self, call: ImageCall) -> ImageReply:
        self._fault()
        return self.images.generate(call)


def _calls(env: Env, step_id: str) -> int:
    return len([c for c in env.ledger.provider_calls() if c["step_id"] == step_id])


def _fail_then_resume(
    env: Env, step_id: str, fail_at: int, *, before_resume: Callable[[], None] | None = None
) -> tuple[int, int]:
    """The step re-run after its checkpoint was lost, failing at call ``fail_at``; then
    resumed with the offline models: (calls of the failed run, calls of the resume)."""
    env.lose_checkpoint(step_id)
    start = _calls(env, step_id)
    failing = Faltering(fail_at)
    with pytest.raises(PipelineError):
        env.run_direct([step_id], text_model=cast(TextModel, failing))
    failed = _calls(env, step_id) - start
    if before_resume is not None:
        before_resume()
    env.run_direct([step_id])
    return failed, _calls(env, step_id) - start - failed


def test_a_text_step_that_failed_part_way_pays_only_for_the_calls_that_never_came_back(
    env: Env,
) -> None:
    """scene_detail makes one call per scene (4): the third fails; the two replies that
    came back are taken back by the resume, which pays for the other two only (was: all
    four paid again)."""
    failed, resumed = _fail_then_resume(env, "scene_detail", 3)
    assert (failed, resumed) == (3, 2)
    assert env.row_of("scene_detail").status == "completed"


def test_a_force_pays_for_new_replies(env: Env) -> None:
    """A force asks for new replies: what the failed attempt was paid for is not taken back."""
    env.lose_checkpoint("scene_detail")
    with pytest.raises(PipelineError):
        env.run_direct(["scene_detail"], text_model=cast(TextModel, Faltering(3)))
    start = _calls(env, "scene_detail")
    env.run_direct(["scene_detail"], mode=LaunchMode.FORCE)
    assert _calls(env, "scene_detail") - start == 4


def test_a_reply_the_step_refused_is_never_taken_back(env: Env) -> None:
    """A malformed reply fails the step (``provider.bad_response``): the next attempt starts
    new work, so it pays for all its calls rather than fail on the same reply again."""
    env.lose_checkpoint("scene_detail")
    start = _calls(env, "scene_detail")
    with pytest.raises(PipelineError) as failure:
        env.run_direct(["scene_detail"], text_model=cast(TextModel, Faltering(2, malformed=True)))
    assert failure.value.code == ErrorCode.PROVIDER_BAD_RESPONSE
    lineage = env.row_of("scene_detail").journal_lineage
    env.run_direct(["scene_detail"])
    assert _calls(env, "scene_detail") - start == 2 + 4
    assert env.row_of("scene_detail").journal_lineage != lineage


def test_a_tampered_entry_is_never_taken_back_and_is_reported(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """An entry whose bytes no longer match its receipt is paid for again, and the run's
    log names it."""
    storage = env.checkpoints.published.shared
    key = env.key("scene_detail")

    def tamper() -> None:
        lineage = env.row_of("scene_detail").journal_lineage
        entries = sorted(m.key for m in storage.list(journal_prefix(key, lineage)))
        assert len(entries) == 2, entries
        data = storage.get(entries[0])
        storage.delete(entries[0])
        storage.put_create(entries[0], data[:-3] + b"}}}")

    with caplog.at_level(logging.WARNING):
        failed, resumed = _fail_then_resume(env, "scene_detail", 3, before_resume=tamper)
    assert (failed, resumed) == (3, 3)
    assert "is not taken back (its bytes do not match its receipt's sha256)" in caplog.text


def test_gc_keeps_what_a_claim_can_take_back_and_leaves_no_orphan(env: Env) -> None:
    """``storyboard gc``'s core: entries of lineages no row holds go once past the grace
    period (the built episode's, whose rows completed); a failed step's stay and are taken
    back by its resume; once that completes, nothing is left in the journal."""
    storage = env.checkpoints.published.shared
    built = {m.key for m in storage.list(JOURNAL)}
    assert len(built) == len(env.ledger.provider_calls())  # one entry per paid reply
    env.lose_checkpoint("scene_detail")
    with pytest.raises(PipelineError):
        env.run_direct(["scene_detail"], text_model=cast(TextModel, Faltering(3)))
    hour = timedelta(hours=1)
    young = collect_unnamed(env.checkpoints, env.ledger, grace=hour)
    assert young.journal == JournalCollection(0, 2, len(built))
    later = datetime.now(UTC) + 2 * hour
    dry = collect_unnamed(env.checkpoints, env.ledger, grace=hour, now=later, dry_run=True)
    assert dry.journal == JournalCollection(len(built), 2, 0)
    assert {m.key for m in storage.list(JOURNAL)} >= built
    done = collect_unnamed(env.checkpoints, env.ledger, grace=hour, now=later)
    assert done.journal == JournalCollection(len(built), 2, 0)
    assert not {m.key for m in storage.list(JOURNAL)} & built
    start = _calls(env, "scene_detail")
    env.run_direct(["scene_detail"])
    assert _calls(env, "scene_detail") - start == 2  # the kept two were taken back
    final = collect_unnamed(env.checkpoints, env.ledger, grace=hour, now=later)
    assert final.journal == JournalCollection(4, 0, 0)
    assert list(storage.list(JOURNAL)) == []


# ------------------------------------------------------------------ the journal itself
KEY = StepKey("demo", "ep01", "scene_image_pipeline")
CALL = ImageCall(prompt="a lighthouse at dusk", caption="S1", width=64, height=48, seed="s1")


def _journal(root: Path) -> ReplyJournal:
    return ReplyJournal(LocalStorage(root), KEY, "lineage-1")


def _digest(call: Any, model: str = "offline-image-v1") -> str:
    return request_digest(KEY.step_id, "image", model, call)


def test_only_the_very_same_request_is_taken_back(tmp_path: Path) -> None:
    """Another prompt, size, seed or model, another occurrence, another lineage: a miss."""
    kept = KeptReply(b"\x89PNG picture", 1, "offline-image-v1")
    journal = _journal(tmp_path)
    assert journal.keep(_digest(CALL), 1, kept, claim="run:0:abc", call_id=7)
    again = _journal(tmp_path)  # another machine's attempt of the same lineage
    assert again.take(_digest(CALL), 1) == kept
    others = [
        _digest(ImageCall(**{**CALL.__dict__, "prompt": "a lighthouse at dawn"})),
        _digest(ImageCall(**{**CALL.__dict__, "width": 65})),
        _digest(ImageCall(**{**CALL.__dict__, "seed": "s2"})),
        _digest(CALL, model="another-image-model"),
    ]
    assert len(set(others)) == 4 and _digest(CALL) not in others
    assert [again.take(other, 1) for other in others] == [None] * 4
    assert again.take(_digest(CALL), 2) is None
    assert ReplyJournal(LocalStorage(tmp_path), KEY, "lineage-2").take(_digest(CALL), 1) is None
    assert again.rejected == []


@pytest.mark.parametrize(
    "damage",
    ["truncated", "bytes", "header", "renamed"],
)
def test_a_damaged_entry_is_never_taken_back(tmp_path: Path, damage: str) -> None:
    storage = LocalStorage(tmp_path)
    journal = _journal(tmp_path)
    payload = b"\x89PNG" + bytes(range(200))
    journal.keep(_digest(CALL), 1, KeptReply(payload, 1, "m"), claim="c", call_id=1)
    name = journal.entry_key(_digest(CALL), 1)
    data = storage.get(name)
    storage.delete(name)
    if damage == "truncated":
        storage.put_create(name, data[:-10])
    elif damage == "bytes":
        storage.put_create(name, data[:-1] + b"X")
    elif damage == "header":
        storage.put_create(name, b"not json\n" + payload)
    else:  # an entry of another request put under this one's name
        other = _journal(tmp_path)
        other.keep(_digest(CALL, "m2"), 1, KeptReply(payload, 1, "m"), claim="c", call_id=2)
        storage.put_create(name, storage.get(other.entry_key(_digest(CALL, "m2"), 1)))
    fresh = _journal(tmp_path)
    assert fresh.take(_digest(CALL), 1) is None
    assert len(fresh.rejected) == 1 and name in fresh.rejected[0]
    assert hashlib.sha256(storage.get(name)).hexdigest()  # left where it was, not deleted


def test_an_entry_another_delivery_kept_first_or_gc_took_is_no_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A second keep of the same entry keeps the first's bytes and says it is kept; an entry
    collected between the listing and the read is a miss, not an error."""
    kept = KeptReply(b"\x89PNG picture", 1, "offline-image-v1")
    assert _journal(tmp_path).keep(_digest(CALL), 1, kept, claim="c", call_id=1)
    with caplog.at_level(logging.WARNING):
        assert _journal(tmp_path).keep(_digest(CALL), 1, kept, claim="c", call_id=2)
    assert "could not be kept" not in caplog.text
    reader = _journal(tmp_path)
    assert reader.take(_digest(CALL), 2) is None  # lists the lineage: the entry is there
    LocalStorage(tmp_path).delete(reader.entry_key(_digest(CALL), 1))
    assert reader.take(_digest(CALL), 1) is None
