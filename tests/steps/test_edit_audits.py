"""A mutator's edit and its history line are one transaction (docs/DESIGN.md#audit), through
real runs: gamma edits alpha's checkpoint.

- the ``mutated`` line is refused by the database (a real trigger): the edit is not applied
  either (the checkpoint, its seal and its row stay as they were), and once the line can be
  written again the next run applies the edit exactly once;
- an edit refused because the victim is running, or was rebuilt after the mutator read it,
  leaves an ``edit_refused`` line naming the mutator's run, and nothing else.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest
from audit_faults import refusing_audit
from judge_steps import Harness, failure, open_harness, step_key

from pipeline_defs.steps.runner.run_info import run_token_of


@pytest.fixture
def h(db_url: str, pipeline_home: Path) -> Iterator[Harness]:
    with open_harness(pipeline_home, db_url) as harness:
        assert harness.run("alpha", "beta").success
        yield harness


def actions(h: Harness, step_id: str) -> list[str]:
    return [a.action for a in h.audit(step_id)]


def test_an_edit_whose_audit_line_is_refused_is_not_applied(h: Harness) -> None:
    before, alpha_row = h.snapshot("alpha"), h.row("alpha")
    h.knobs("gamma", mutate="good")

    with refusing_audit(h.db_url, "mutated"):
        result = h.run("gamma")
    assert not result.success
    description, _ = failure(result, "gamma")
    assert "the audit line is refused" in description
    # Nothing half-applied: the file (bytes and mtime), the seal and the row as before.
    assert h.snapshot("alpha") == before
    assert h.row("alpha") == alpha_row
    assert "mutated" not in actions(h, "alpha")

    # The line can be written again: the written-ahead edit is applied, once.
    again = h.run("gamma")
    assert again.success
    assert h.envelope("alpha")["data"]["items"][-1] == "reviewed-by-gamma"
    assert actions(h, "alpha").count("mutated") == 1
    row = h.row("alpha")
    assert row is not None and alpha_row is not None
    assert row.checkpoint_seal != alpha_row.checkpoint_seal


def test_an_edit_refused_because_the_victim_is_running_is_recorded(h: Harness) -> None:
    before = h.snapshot("alpha")
    h.knobs("gamma", mutate="good")
    assert h.ledger.claim(step_key("alpha"), "alpha-rebuild:0")  # a rebuild in flight
    lines_before = len(h.audit("alpha"))

    result = h.run("gamma")
    assert not result.success
    assert "step.victim_running" in failure(result, "gamma")[0]
    assert h.snapshot("alpha") == before
    new = h.audit("alpha")[lines_before:]
    assert [a.action for a in new] == ["edit_refused"]
    (line,) = new
    assert run_token_of(str(line.run_id)) == f"{result.run_id}:0"
    assert (line.from_status, line.to_status) == ("running", "running")
    assert line.reason is not None
    assert "edit by gamma refused" in line.reason and "running" in line.reason


def test_an_edit_of_a_victim_rebuilt_since_it_was_read_is_refused_and_recorded(
    h: Harness,
) -> None:
    alpha_row = h.row("alpha")
    h.knobs("gamma", mutate="good", rebuild_victim=True)

    result = h.run("gamma")
    assert not result.success
    assert "mutation.victim_changed" in failure(result, "gamma")[0]
    items = h.envelope("alpha")["data"]["items"]
    assert "rebuilt-meanwhile" in items and "reviewed-by-gamma" not in items
    assert h.row("alpha") == alpha_row  # no seal of the edit
    refused = [a for a in h.audit("alpha") if a.action == "edit_refused"]
    assert len(refused) == 1
    assert run_token_of(str(refused[0].run_id)) == f"{result.run_id}:0"
    assert "no longer the checkpoint gamma read" in (refused[0].reason or "")
    assert "mutated" not in actions(h, "alpha")
