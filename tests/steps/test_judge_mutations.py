"""The mutator hook (finalize stage 7) through real runs: gamma edits alpha's checkpoint.

An accepted edit is archived first, written under alpha's row lock and recorded in
``mutations[]``; a rejected edit leaves the victim byte-identical; zero fixes write nothing;
nothing downstream is ever invalidated."""

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from judge_steps import Harness, failure, mat_metadata, open_harness, step_key

from pipeline_defs.resume.layout import ARCHIVE_DIR
from pipeline_defs.steps.runner.run_info import run_token_of
from resources.checkpoints.store import CheckpointStore


@pytest.fixture
def h(db_url: str, pipeline_home: Path) -> Iterator[Harness]:
    with open_harness(pipeline_home, db_url) as harness:
        assert harness.run("alpha", "beta").success
        yield harness


def archived(h: Harness, step_id: str) -> list[bytes]:
    folder = h.path(step_id).parent / ARCHIVE_DIR
    return [p.read_bytes() for p in sorted(folder.iterdir())] if folder.exists() else []


def test_an_accepted_edit_is_archived_recorded_and_never_cascades(h: Harness) -> None:
    original = h.path("alpha").read_bytes()
    alpha_row, beta = h.row("alpha"), (h.snapshot("beta"), h.row("beta"))
    assert alpha_row is not None
    h.knobs("gamma", mutate="good")

    result = h.run("gamma")
    assert result.success
    run = f"{result.run_id}:0"
    envelope = h.envelope("alpha")
    assert envelope["data"]["items"][-1] == "reviewed-by-gamma"
    assert [{**m, "run_id": run_token_of(m["run_id"])} for m in envelope["mutations"]] == [
        {
            "by_step": "gamma",
            "run_id": run,
            "at": envelope["mutations"][0]["at"],
            "fields": ["items"],
            "origin": "gamma good fix",
        }
    ]
    assert envelope["produced_by"] == {**envelope["produced_by"], "run_id": alpha_row.run_id}
    assert archived(h, "alpha") == [original]
    # The victim is not auto-staled: its row only gets a new seal, naming the edit.
    row = h.row("alpha")
    assert row is not None and alpha_row is not None
    assert replace(row, checkpoint_seal=None) == replace(alpha_row, checkpoint_seal=None)
    assert row.checkpoint_seal != alpha_row.checkpoint_seal
    assert f"|{alpha_row.run_id}|1" in (row.checkpoint_seal or "")  # version: one mutation
    assert (h.snapshot("beta"), h.row("beta")) == beta  # nothing downstream invalidated
    audit = h.audit("alpha")[-1]
    assert (audit.action, run_token_of(str(audit.run_id))) == ("mutated", run)
    assert "fields ['items']" in (audit.reason or "")

    # the edited victim still verifies clean: the next run skips it and serves the edit
    again = h.run("alpha")
    assert again.success
    meta = mat_metadata(again, "alpha")
    assert meta["resume/decision"] == "skip"
    assert meta["checkpoint/content_hash"] == envelope["content_hash"]


def test_a_rejected_edit_leaves_the_victim_byte_identical(h: Harness) -> None:
    before = h.snapshot("alpha")
    alpha_row = h.row("alpha")
    h.knobs("gamma", mutate="bad")

    result = h.run("gamma")
    assert not result.success
    description, _ = failure(result, "gamma")
    assert "step.mutation_rejected" in description
    assert "items_hash" in description
    assert h.snapshot("alpha") == before
    assert archived(h, "alpha") == []
    assert h.row("alpha") == alpha_row
    assert "mutated" not in [a.action for a in h.audit("alpha")]
    row = h.row("gamma")
    assert row is not None and row.status == "failed"  # the mutator fails, not the victim
    assert "mutation_rejected" in (row.error_message or "")


def test_an_edit_the_victims_verifier_rejects_is_rolled_back(h: Harness) -> None:
    """The edit verified clean before it was applied, but what the victim's verifier reads
    changed meanwhile: re-verified once applied, it fails, so it is rolled back to the
    version read (recorded), and the mutator fails; the victim serves the old version."""
    before = h.snapshot("alpha")
    h.knobs("alpha", verify_rejects_item="reviewed-by-gamma", verify_rejects_after=1)
    h.knobs("gamma", mutate="good")

    result = h.run("gamma")
    assert not result.success
    description, _ = failure(result, "gamma")
    assert "step.mutation_rejected" in description and "rolled back" in description
    now = h.snapshot("alpha")
    assert before is not None and now is not None
    restored, read = json.loads(now[0]), json.loads(before[0])
    assert restored["content_hash"] == read["content_hash"]
    assert "reviewed-by-gamma" not in restored["data"]["items"]
    reasons = [a.reason or "" for a in h.audit("alpha")]
    assert any("rolled back" in reason for reason in reasons), reasons
    row = h.row("gamma")
    assert row is not None and row.status == "failed"


def test_a_run_that_lost_its_claim_writes_no_edit_ahead(h: Harness) -> None:
    """Another owner takes the review's row while it runs (its lease thread has not seen it
    yet, as after a pause): the old owner must not write its edits ahead, where they would
    replace the new owner's; the write-ahead is fenced like a publish."""
    h.knobs("gamma", mutate="good", steal="claim")
    result = h.run("gamma")
    assert not result.success
    _, meta = failure(result, "gamma")
    assert meta["error/code"] == "step.ownership_lost"
    store = CheckpointStore(h.home)
    gamma = step_key("gamma")
    assert store.load_pending(gamma, "alpha") is None
    assert store.load_pending(gamma, "gamma") is None


def test_zero_fixes_write_nothing(h: Harness) -> None:
    before = h.snapshot("alpha")
    h.knobs("gamma", mutate="same")
    assert h.run("gamma").success
    assert h.snapshot("alpha") == before
    assert archived(h, "alpha") == []
    assert "mutated" not in [a.action for a in h.audit("alpha")]


def test_an_edit_is_refused_while_the_victim_is_running(h: Harness) -> None:
    before = h.snapshot("alpha")
    h.knobs("gamma", mutate="good")
    # another run has re-claimed alpha (e.g. a forced rebuild in flight)
    assert h.ledger.claim(step_key("alpha"), "alpha-rebuild:0")

    result = h.run("gamma")
    assert not result.success
    description, _ = failure(result, "gamma")
    assert "step.victim_running" in description
    assert h.snapshot("alpha") == before
    assert h.envelope("alpha")["mutations"] == []
