"""Claims and fencing through real runs: a run that lost its claim publishes nothing, a
concurrent second run is refused with ``step.already_running`` (two real processes), a
stale lease is recovered and the dead worker that comes back cannot overwrite anything."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import ROOT, TESTS_DIR
from judge_steps import (
    THIEF_RUN_ID,
    Harness,
    failure,
    make_data,
    mat_metadata,
    open_harness,
    step_key,
)

from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.runner.run_info import run_token_of
from resources.checkpoints.envelope import Checkpoint

REPO = ROOT
LONG_AGO = "2020-01-01T00:00:00.000000Z"


@pytest.mark.parametrize("steal", ["claim", "publish"])
def test_a_run_that_lost_its_claim_cannot_publish(h: Harness, steal: str) -> None:
    h.knobs("alpha", steal=steal)
    result = h.run("alpha")
    assert not result.success
    description, meta = failure(result, "alpha")
    assert meta["error/code"] == "step.ownership_lost"
    assert "lost its claim" in description and "nothing published" in description
    (victim,) = [c["victim"] for c in h.calls("alpha", "steal")]  # the claim's own token
    assert run_token_of(victim) == f"{result.run_id}:0"

    row = h.row("alpha")
    assert row is not None and row.run_id == THIEF_RUN_ID
    if steal == "claim":
        assert row.status == "running"  # still the thief's; the victim wrote nothing
        assert not h.path("alpha").exists()
    else:
        assert row.status == "completed"
        envelope = h.envelope("alpha")  # the thief's checkpoint survives
        assert envelope["produced_by"]["run_id"] == THIEF_RUN_ID
        assert envelope["data"]["items"] == ["written-by-the-thief"]
    # the victim recorded neither a finish nor a failure over the thief's row: its refused
    # publish is in the history, as what it was (written in the transaction that found it)
    # The victim, fenced out by its own claim token, wrote nothing after its claim: not a
    # finish, not a failure, not even a refusal line over the thief's row.
    assert [(a.action, a.run_id, a.to_status) for a in h.audit("alpha")] == [
        ("rerun_self", victim, "running"),
    ]
    assert row.error_message is None


def test_a_second_concurrent_run_is_refused_and_the_body_runs_once(
    db_url: str, pipeline_home: Path, tmp_path: Path
) -> None:
    """Two real processes materialize the same partition at the same moment: both pass the
    judge (a barrier inside applicability holds them until both arrived), both claim, one
    wins, the other fails with ``step.already_running``. They share one Dagster instance, as
    a deployment's processes do: each knows the other's run is live (a run its instance did
    not know would be a deleted one, a dead owner to take the row from)."""
    dagster_home = tmp_path / "dagster_home"
    # migrates the ledger first
    with open_harness(pipeline_home, db_url, dagster_home=dagster_home) as harness:
        harness.knobs("alpha", barrier=2, sleep=1.0)
        harness.instance.add_dynamic_partitions("episodes", ["proj1/ep1"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), str(REPO)])}
    code = "import sys, judge_steps; sys.exit(judge_steps.main(sys.argv[1:]))"
    args = [str(pipeline_home), db_url, "alpha", "proj1/ep1", str(dagster_home)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for _ in range(2)
    ]
    outcomes = []
    for child in children:
        stdout, stderr = child.communicate(timeout=120)
        assert child.returncode == 0, stderr[-3000:]
        line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
        outcomes.append(json.loads(line.removeprefix("RESULT ")))

    winners = [o for o in outcomes if o["success"]]
    losers = [o for o in outcomes if not o["success"]]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert losers[0]["code"] == "step.already_running", losers[0]
    with open_harness(pipeline_home, db_url, dagster_home=dagster_home) as harness:
        for outcome in outcomes:  # both runs are in the one instance
            assert harness.instance.get_run_by_id(outcome["owner"].split(":")[0]) is not None
        assert len(harness.calls("alpha")) == 1  # the body ran once
        assert len(harness.calls("alpha", "verify")) == 1
        row = harness.row("alpha")
        assert row is not None
        assert (row.status, run_token_of(str(row.run_id))) == ("completed", winners[0]["owner"])
        assert (
            run_token_of(harness.envelope("alpha")["produced_by"]["run_id"]) == winners[0]["owner"]
        )
        actions = [(a.action, run_token_of(str(a.run_id))) for a in harness.audit("alpha")]
        assert ("claim_rejected", losers[0]["owner"]) in actions
        assert ("finish", winners[0]["owner"]) in actions
        assert len(harness.provider_calls("alpha")) == 1


def test_a_healthy_running_row_fails_a_later_launch_like_a_lost_race(h: Harness) -> None:
    assert h.ledger.claim(step_key("alpha"), "someone-else:0")
    before = h.row("alpha")
    result = h.run("alpha")
    assert not result.success
    description, meta = failure(result, "alpha")
    assert meta["error/code"] == "step.already_running"  # row 6: BLOCK, same code as a race
    assert "running healthy" in description and "someone-else:0" in description
    assert h.row("alpha") == before
    assert h.calls("alpha") == []


def test_a_force_never_steals_a_stale_lease_and_says_what_to_do(h: Harness) -> None:
    key = step_key("alpha")
    assert h.ledger.claim(key, "dead-worker:0", now=LONG_AGO)
    before = h.row("alpha")
    result = h.run("alpha", tags={"resume/mode": "force"})
    assert not result.success
    description, meta = failure(result, "alpha")
    assert meta["error/code"] == "step.already_running"
    assert "expired lease" in description and "dead-worker:0" in description
    assert f"storyboard reset-running --partition {key.partition_key} --step alpha" in description
    assert h.row("alpha") == before and h.calls("alpha") == []


def test_a_stale_lease_is_recovered_and_the_dead_worker_cannot_publish(h: Harness) -> None:
    key = step_key("alpha")
    assert h.ledger.claim(key, "dead-worker:0", now=LONG_AGO)
    result = h.run("alpha")
    assert result.success
    meta = mat_metadata(result, "alpha")
    assert meta["resume/decision"] == "stale_running_recovery"
    row = h.row("alpha")
    assert row is not None
    assert (row.status, run_token_of(str(row.run_id))) == ("completed", f"{result.run_id}:0")
    published = h.snapshot("alpha")

    # the dead worker comes back and tries to finish its work
    stale = Checkpoint(
        step_id="alpha",
        project_id="proj1",
        episode_id="ep1",
        status=StepStatus.COMPLETED,
        schema_version=1,
        config_hash="stale",
        resume_config_keys=(),
        config_fingerprints={},
        project_config_snapshot={},
        data=make_data(["from-the-dead-worker"]),
        produced_by={"run_id": "dead-worker:0"},
    )
    with pytest.raises(PipelineError) as caught:
        h.checkpoints.save(
            stale, fence=lambda staged: h.ledger.publish(key, "dead-worker:0", staged.commit)
        )
    assert caught.value.code == "step.ownership_lost"
    assert not h.ledger.transition(key, "dead-worker:0", "completed")
    assert h.snapshot("alpha") == published
    assert h.row("alpha") == row
