"""The launch path (UI, sensor, backfill, CLI, API — from run tags) is recorded in audit rows
and in the checkpoint's provenance, and never changes the decision or the claim."""

import pytest
import yaml
from judge_steps import Harness, failure, mat_metadata

from pipeline_defs.steps.runner.run_info import run_token_of

LAUNCHES = [
    ({}, "api"),
    ({"dagster/from_ui": "true"}, "ui"),
    ({"dagster/backfill": "bkfl-0001"}, "backfill"),
    ({"dagster/sensor_name": "resume_sensor"}, "sensor"),
    ({"resume/launch_path": "cli"}, "cli"),
]


def test_every_launch_path_reaches_the_same_decision_and_claim(h: Harness) -> None:
    first_runs = set()
    for i, (tags, path) in enumerate(LAUNCHES):
        partition = f"proj1/ep{i}"
        result = h.run("alpha", partition=partition, tags=tags)
        assert result.success
        meta = mat_metadata(result, "alpha")
        first_runs.add((meta["resume/decision"], meta["resume/reason"], meta["resume/origin"]))
        owner = f"{result.run_id}:0"
        audit = h.audit("alpha", partition)
        assert [(a.action, a.launch_path, run_token_of(str(a.run_id))) for a in audit] == [
            ("rerun_self", path, owner),
            ("finish", path, owner),
        ]
        row = h.row("alpha", partition)
        assert row is not None and (row.status, run_token_of(str(row.run_id))) == (
            "completed",
            owner,
        )
        assert h.envelope("alpha", partition)["produced_by"]["launch_path"] == path
    assert first_runs == {("first_run", "first run", "none")}

    # the same completed state, judged from every launch path: SKIP, recorded per path
    skips = set()
    for tags, path in LAUNCHES:
        result = h.run("alpha", partition="proj1/ep0", tags=tags)
        assert result.success
        meta = mat_metadata(result, "alpha")
        skips.add((meta["resume/decision"], meta["resume/reason"]))
        last = h.audit("alpha", "proj1/ep0")[-1]
        assert (last.action, last.launch_path) == ("skip", path)
    assert skips == {("skip", "completed and verified clean")}

    # the same blocked state: the same BLOCK with the same reason from every path
    config = h.home / "projects" / "proj1" / "project.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump({"style": "watercolor"}))
    blocks = set()
    for tags, path in LAUNCHES:
        result = h.run("alpha", partition="proj1/ep0", tags=tags)
        assert not result.success
        description, meta = failure(result, "alpha")
        blocks.add((meta["error/code"], meta["error/origin"], description))
        last = h.audit("alpha", "proj1/ep0")[-1]
        assert (last.action, last.launch_path) == ("block", path)
    assert len(blocks) == 1
    (code, origin, description) = blocks.pop()
    assert (code, origin) == ("step.resume_blocked", "contract_drift")
    assert "style" in description
    assert len(h.calls("alpha")) == len(LAUNCHES)  # one body execution per first run only


def test_an_overlong_launch_path_tag_is_clamped_and_never_strands_a_claim(h: Harness) -> None:
    tags = {"resume/launch_path": "nightly-maintenance-script-v2"}
    result = h.run("alpha", tags=tags)
    assert result.success, failure(result, "alpha")
    assert {a.launch_path for a in h.audit("alpha")} == {"nightly-maintena"}
    row = h.row("alpha")
    assert row is not None and row.status == "completed"


def test_a_failure_right_after_the_claim_is_recorded_not_left_running(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first thing after the claim (its audit line is in the claim's own transaction):
    # a failure there must still be recorded as the run's final word.
    from pipeline_defs.steps import faults, runner

    original = faults.crash_point  # the function runner imports and calls as crash_point

    def flaky(stage: str, step_id: str) -> None:
        if stage == "claimed":
            raise RuntimeError("audit database hiccup")
        original(stage, step_id)

    monkeypatch.setattr(runner, "crash_point", flaky)
    result = h.run("alpha")
    assert not result.success
    row = h.row("alpha")
    assert row is not None
    assert row.status == "failed"  # not a 'running' row blocking every launch for an hour
    assert "audit database hiccup" in (row.error_message or "")
    assert h.calls("alpha") == []
