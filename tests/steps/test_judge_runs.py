"""The run protocol end to end: real Dagster in-process runs, real SQLite and PostgreSQL.

Each reachable row of docs/DESIGN.md#decision-table goes through ``dg.materialize`` of the test-only
steps in ``judge_steps`` and asserted through ledger rows, audit rows and files.
"""

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from judge_steps import (
    Alpha,
    Harness,
    data_version,
    failure,
    mat_metadata,
    open_harness,
    rehash_envelope,
    step_key,
)

from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.files import file_sha256
from pipeline_defs.resume.layout import ARCHIVE_DIR, FORCE_MARKER
from pipeline_defs.steps.runner.run_info import run_token_of
from resources.ledger.tables import step_run

FORCE = {"resume/mode": "force"}
# The tag Dagster puts on runs a sensor requests: the resume sensor's recoveries are the
# automatic ones, counted toward max_recovery_attempts.
SENSOR_RUN = {"dagster/sensor_name": "resume_sensor"}


@pytest.fixture
def hp(db_url: str, pipeline_home: Path) -> Iterator[Harness]:
    """On ``dg.instance_for_test()``: run and event storage persisted in SQLite."""
    with open_harness(pipeline_home, db_url, persistent=True) as harness:
        yield harness


def owner(result: dg.ExecuteInProcessResult) -> str:
    return f"{result.run_id}:0"


def write_project(home: Path, **config: object) -> None:
    path = home / "projects" / "proj1" / "project.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))


def stored_version(record: dg.EventLogRecord) -> str:
    """The data version a materialization the instance stored carries."""
    materialization = record.asset_materialization
    assert materialization is not None and materialization.tags is not None, record
    return materialization.tags["dagster/data_version"]


def archives(h: Harness, step_id: str) -> list[Path]:
    folder = h.path(step_id).parent / ARCHIVE_DIR
    return sorted(folder.iterdir()) if folder.exists() else []


def test_first_run_records_row_checkpoint_audit_and_cost(h: Harness) -> None:
    result = h.run("alpha", "beta")
    assert result.success
    run = owner(result)
    for step_id in ("alpha", "beta"):
        row = h.row(step_id)
        assert row is not None
        assert row.status == "completed"
        assert run_token_of(str(row.run_id)) == run
        assert (row.applicable_count, row.completed_count, row.failed_count) == (2, 2, 0)
        assert row.recovery_count == 0 and row.error_message is None
        envelope = h.envelope(step_id)
        assert envelope["status"] == "completed"
        assert run_token_of(envelope["produced_by"]["run_id"]) == run
        assert envelope["schema_version"] == 1
        assert envelope["content_hash"] == data_version(result, step_id)
        meta = mat_metadata(result, step_id)
        assert meta["resume/decision"] == "first_run"  # not a re-run: it never ran
        assert meta["resume/reason"] == "first run"
        assert meta["resume/provider_calls"] == 1
        assert meta["checkpoint/path"] == str(h.path(step_id))
        assert [(a.action, a.from_status, a.to_status) for a in h.audit(step_id)] == [
            ("rerun_self", None, "running"),
            ("finish", "running", "completed"),
        ]
        assert [run_token_of(c["run_id"]) for c in h.provider_calls(step_id)] == [run]
        assert len(h.calls(step_id)) == 1
    (artifact,) = h.envelope("alpha")["artifacts"]
    path = h.path("alpha").parent / artifact["path"]
    assert file_sha256(path) == artifact["sha256"]
    assert path.stat().st_size == artifact["bytes"]
    assert h.calls("beta")[0]["inputs"] == ["alpha"]
    assert h.envelope("beta")["data"]["items"][0] == "beta<alpha-0>"


def test_skip_runs_no_body_rewrites_nothing_and_keeps_the_data_version(hp: Harness) -> None:
    h = hp
    first = h.run("alpha")
    assert first.success
    before = h.snapshot("alpha")
    row_before = h.row("alpha")
    # beta has never run: the same run must still judge it on its own after alpha's SKIP
    second = h.run("alpha", "beta")
    assert second.success
    meta = mat_metadata(second, "alpha")
    assert meta["resume/decision"] == "skip"
    assert meta["resume/reason"] == "completed and verified clean"
    assert meta["resume/provider_calls"] == 0
    assert meta["checkpoint/rewritten"] is False
    assert mat_metadata(second, "beta")["resume/decision"] == "first_run"
    third = h.run("alpha", "beta")
    assert third.success
    assert {mat_metadata(third, s)["resume/decision"] for s in ("alpha", "beta")} == {"skip"}

    assert len(h.calls("alpha")) == 1 and len(h.calls("beta")) == 1
    assert len(h.provider_calls("alpha")) == 1
    assert h.snapshot("alpha") == before  # same bytes and same mtime
    assert h.row("alpha") == row_before  # SKIP changes no ledger row
    assert archives(h, "alpha") == []
    versions = {data_version(r, "alpha") for r in (first, second, third)}
    assert versions == {h.envelope("alpha")["content_hash"]}
    assert data_version(second, "beta") == data_version(third, "beta")
    assert [a.action for a in h.audit("alpha")] == ["rerun_self", "finish", "skip", "skip"]
    # what the instance stored agrees: three materializations, one data version
    stored = h.instance.fetch_materializations(dg.AssetKey("alpha"), limit=10).records
    assert len(stored) == 3
    assert {stored_version(r) for r in stored} == versions


def test_artifact_missing_reruns_self_and_leaves_downstream_untouched(h: Harness) -> None:
    assert h.run("alpha", "beta").success
    beta_before = (h.snapshot("beta"), h.row("beta"), len(h.audit("beta")))
    (artifact,) = h.envelope("alpha")["artifacts"]
    artifact_path = h.path("alpha").parent / artifact["path"]
    artifact_path.unlink()

    result = h.run("alpha", "beta")
    assert result.success
    meta = mat_metadata(result, "alpha")
    assert meta["resume/decision"] == "rerun_self"
    assert meta["resume/origin"] == "artifact_missing"
    assert artifact["path"] in meta["resume/reason"]
    assert file_sha256(artifact_path) == artifact["sha256"]
    row = h.row("alpha")
    assert row is not None
    assert row.status == "completed" and run_token_of(str(row.run_id)) == owner(result)
    assert row.recovery_count == 0  # counted as a recovery, reset on success
    audit = h.audit("alpha")[-2]
    assert (audit.action, audit.origin, audit.from_status) == (
        "rerun_self",
        "artifact_missing",
        "completed",
    )
    # downstream: judged on its own (SKIP), never invalidated, never re-executed
    assert mat_metadata(result, "beta")["resume/decision"] == "skip"
    assert (h.snapshot("beta"), h.row("beta")) == beta_before[:2]
    assert [a.action for a in h.audit("beta")[beta_before[2] :]] == ["skip"]
    assert len(h.calls("beta")) == 1
    assert not (h.path("beta").parent / FORCE_MARKER).exists()


def test_checkpoint_gone_while_ledger_says_completed_reruns_self(h: Harness) -> None:
    assert h.run("alpha", "beta").success
    beta_before = (h.snapshot("beta"), h.row("beta"))
    h.path("alpha").unlink()
    result = h.run("alpha")
    assert result.success
    meta = mat_metadata(result, "alpha")
    assert (meta["resume/decision"], meta["resume/origin"], meta["resume/reason"]) == (
        "rerun_self",
        "artifact_missing",
        "ledger says completed but the checkpoint is absent",
    )
    assert h.path("alpha").exists()
    assert (h.snapshot("beta"), h.row("beta")) == beta_before


def test_a_verified_orphan_checkpoint_is_adopted_not_rerun(h: Harness) -> None:
    assert h.run("alpha").success
    before = h.snapshot("alpha")
    with h.ledger.engine.begin() as conn:  # the ledger was wiped; the files survived
        conn.execute(sa.delete(step_run))
    result = h.run("alpha")
    assert result.success
    meta = mat_metadata(result, "alpha")
    assert meta["resume/decision"] == "skip"
    assert "adopts the verified checkpoint" in meta["resume/reason"]
    row = h.row("alpha")
    assert row is not None
    assert (row.status, run_token_of(str(row.run_id))) == ("completed", owner(result))
    last = h.audit("alpha")[-1]
    assert (last.action, last.from_status, last.to_status) == (
        "adopt",
        None,
        "completed",
    )
    assert h.snapshot("alpha") == before and len(h.calls("alpha")) == 1


def test_schema_bump_blocks_with_the_reason_in_the_dagster_failure(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert h.run("alpha", "beta").success
    before = (h.snapshot("alpha"), h.row("alpha"), h.snapshot("beta"), h.row("beta"))
    monkeypatch.setattr(Alpha, "schema_version", 2)

    result = h.run("alpha", "beta")
    assert not result.success
    description, meta = failure(result, "alpha")
    assert "schema_version 1 differs from the step's schema_version 2" in description
    assert meta["error/code"] == "step.resume_blocked"
    assert meta["error/origin"] == "contract_drift"
    assert meta["resume/partition"] == "proj1/ep1"
    assert "beta" not in result.get_failed_step_keys()
    # Dagster does not start the downstream of a BLOCK in the same run
    assert not any(e.is_step_start for e in result.events_for_node("beta"))
    assert result.asset_materializations_for_node("beta") == []
    assert (h.snapshot("alpha"), h.row("alpha"), h.snapshot("beta"), h.row("beta")) == before
    assert len(h.calls("alpha")) == 1
    block = h.audit("alpha")[-1]
    assert (block.action, block.origin) == ("block", "contract_drift")


def test_schema_bump_reruns_self_for_an_allow_listed_step(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert h.run("alpha").success
    old = h.path("alpha").read_bytes()
    monkeypatch.setattr(Alpha, "schema_version", 2)
    monkeypatch.setattr(Alpha, "allow_auto_rerun_on_schema_bump", True)

    result = h.run("alpha")
    assert result.success
    meta = mat_metadata(result, "alpha")
    assert (meta["resume/decision"], meta["resume/origin"]) == ("rerun_self", "contract_drift")
    assert "allows an automatic rerun" in meta["resume/reason"]
    assert h.envelope("alpha")["schema_version"] == 2
    assert len(h.calls("alpha")) == 2
    assert [p.read_bytes() for p in archives(h, "alpha")] == [old]  # replaced = archived


def test_scoped_config_change_blocks_and_names_the_key(h: Harness) -> None:
    write_project(h.home, style="ink storyboard", title="One")
    assert h.run("alpha", "beta").success
    before = h.snapshot("alpha")
    write_project(h.home, style="watercolor", title="One")

    result = h.run("alpha")
    assert not result.success
    description, meta = failure(result, "alpha")
    assert "scoped config changed for keys: style" in description
    assert (meta["error/code"], meta["error/origin"]) == ("step.resume_blocked", "contract_drift")
    assert h.snapshot("alpha") == before
    # beta does not list `style` in its resume_config_keys: the edit does not concern it
    again = h.run("beta")
    assert again.success
    assert mat_metadata(again, "beta")["resume/decision"] == "skip"


def test_unrelated_config_change_skips(h: Harness) -> None:
    write_project(h.home, style="ink storyboard", title="One")
    assert h.run("alpha").success
    before = h.snapshot("alpha")
    write_project(h.home, style="ink storyboard", title="Two", scenes={"shots_per_scene": 3})

    result = h.run("alpha")
    assert result.success
    assert mat_metadata(result, "alpha")["resume/decision"] == "skip"
    assert h.snapshot("alpha") == before
    assert len(h.calls("alpha")) == 1


def test_invariant_drift_blocks(h: Harness) -> None:
    assert h.run("alpha").success
    raw = h.envelope("alpha")
    raw["data"]["items"][0] = "edited-by-hand"  # the sentinel's items_hash is now stale
    h.path("alpha").write_text(json.dumps(rehash_envelope(raw)))  # consistent: it loads
    tampered = h.path("alpha").read_bytes()
    assert h.checkpoints.load(step_key("alpha")) is not None  # the envelope itself loads

    result = h.run("alpha")
    assert not result.success
    description, meta = failure(result, "alpha")
    assert (meta["error/code"], meta["error/origin"]) == ("step.resume_blocked", "invariant_drift")
    assert "items_hash" in description
    assert h.path("alpha").read_bytes() == tampered
    assert len(h.calls("alpha")) == 1


def test_verifier_crash_at_entry_blocks_with_verify_crashed(h: Harness) -> None:
    assert h.run("alpha").success
    before = (h.snapshot("alpha"), h.row("alpha"))
    h.knobs("alpha", verify_crash="entry")

    result = h.run("alpha")
    assert not result.success
    description, meta = failure(result, "alpha")
    assert (meta["error/code"], meta["error/origin"]) == ("step.verify_crashed", "verify_crashed")
    assert "KeyError" in description
    assert (h.snapshot("alpha"), h.row("alpha")) == before
    assert len(h.calls("alpha")) == 1
    assert h.audit("alpha")[-1].action == "block"


def test_verifier_crash_at_exit_fails_and_writes_no_checkpoint(h: Harness) -> None:
    h.knobs("alpha", verify_crash="exit")
    result = h.run("alpha")
    assert not result.success
    description, meta = failure(result, "alpha")
    assert meta["error/code"] == "step.verify_crashed"
    assert meta["error/origin"] == "verify_crashed"
    assert "exit verification crashed" in description
    assert not h.path("alpha").exists()
    row = h.row("alpha")
    assert row is not None
    assert row.status == "failed"
    assert "exit verification crashed: KeyError" in (row.error_message or "")
    assert [c["phase"] for c in h.calls("alpha", "verify")] == ["exit"]
    assert [a.action for a in h.audit("alpha")] == ["rerun_self", "failed"]

    h.knobs("alpha", verify_crash=None)
    again = h.run("alpha")
    assert again.success
    assert mat_metadata(again, "alpha")["resume/reason"] == "auto recovery from failed"
    assert h.path("alpha").exists()


def test_exit_verify_incomplete_publishes_partial(h: Harness) -> None:
    h.knobs("alpha", verify_incomplete="exit")
    result = h.run("alpha")
    assert result.success
    row = h.row("alpha")
    assert row is not None and row.status == "partial"
    assert h.envelope("alpha")["status"] == "partial"
    assert mat_metadata(result, "alpha")["resume/status"] == "partial"


def test_a_typed_verifier_error_is_contract_drift_not_a_crash(h: Harness) -> None:
    h.knobs("alpha", verify_typed_error="exit")
    result = h.run("alpha")
    assert result.success  # exit: an incomplete verdict → partial, published
    row = h.row("alpha")
    assert row is not None and row.status == "partial"
    assert h.envelope("alpha")["status"] == "partial"
    h.knobs("alpha", verify_typed_error=None)
    assert h.run("alpha").success  # partial → automatic rerun → completed
    h.knobs("alpha", verify_typed_error="entry")
    blocked = h.run("alpha")
    assert not blocked.success
    description, meta = failure(blocked, "alpha")
    assert (meta["error/code"], meta["error/origin"]) == ("step.resume_blocked", "contract_drift")
    assert "card field absent" in description


@pytest.mark.parametrize("how", ["fail", "raise"])
def test_failed_step_reruns_self_then_resets_recovery(h: Harness, how: str) -> None:
    knob = {"fail": "all"} if how == "fail" else {"raise": "body exploded"}
    h.knobs("alpha", **knob)
    result = h.run("alpha")
    assert not result.success
    description, meta = failure(result, "alpha")
    if how == "fail":
        assert meta["error/code"] == "step.execute_failed"
    else:
        assert "body exploded" in description
    assert not h.path("alpha").exists()
    row = h.row("alpha")
    assert row is not None and row.status == "failed"
    if how == "raise":
        assert "body exploded" in (row.error_message or "")
    # (6) failed → retry_not_before = now + attempts * retry_backoff_seconds (default 30 s)
    retry_at, updated_at = parse_timestamp(row.retry_not_before), parse_timestamp(row.updated_at)
    assert retry_at is not None and updated_at is not None, row
    delay = retry_at - updated_at
    assert timedelta(seconds=29) < delay <= timedelta(seconds=31)

    h.knobs("alpha", fail=None, **{"raise": None})
    again = h.run("alpha")
    assert again.success
    meta = mat_metadata(again, "alpha")
    assert (meta["resume/decision"], meta["resume/reason"]) == (
        "rerun_self",
        "auto recovery from failed",
    )
    row = h.row("alpha")
    assert row is not None
    assert row.status == "completed" and row.error_message is None
    assert (row.recovery_count, row.retry_not_before, row.last_recovery_reason) == (
        0,
        None,
        None,
    )
    audit = h.audit("alpha")[-2]
    assert (audit.action, audit.from_status, audit.to_status) == (
        "rerun_self",
        "failed",
        "running",
    )


def test_partial_result_is_published_and_rerun(h: Harness) -> None:
    h.knobs("alpha", fail="partial")
    result = h.run("alpha")
    assert result.success
    row = h.row("alpha")
    assert row is not None
    assert (row.status, row.completed_count, row.failed_count) == ("partial", 1, 1)
    assert h.envelope("alpha")["status"] == "partial"
    h.knobs("alpha", fail=None)
    again = h.run("alpha")
    assert again.success
    assert mat_metadata(again, "alpha")["resume/reason"] == "auto recovery from partial"
    assert h.envelope("alpha")["status"] == "completed"


def test_recovery_exhausted_after_three_automatic_recoveries(h: Harness) -> None:
    h.knobs("alpha", fail="all")
    assert not h.run("alpha").success  # an operator's retries are not counted
    assert not h.run("alpha").success
    row = h.row("alpha")
    assert row is not None and row.recovery_count == 0
    counts = []
    for _ in range(3):  # three automatic recoveries: runs the resume sensor launched
        assert not h.run("alpha", tags=SENSOR_RUN).success
        row = h.row("alpha")
        assert row is not None and row.status == "failed"
        counts.append(row.recovery_count)
    assert counts == [1, 2, 3]
    row_before = h.row("alpha")

    result = h.run("alpha")
    assert not result.success
    description, meta = failure(result, "alpha")
    assert meta["error/code"] == "step.recovery_exhausted"
    assert "recovery exhausted after 3 automatic recoveries" in description
    assert "auto recovery from failed" in description  # the last recovery reason
    assert "storyboard force --partition proj1/ep1 --step alpha" in description  # way out
    assert len(h.calls("alpha")) == 5  # the body did not run again
    assert h.row("alpha") == row_before
    assert h.audit("alpha")[-1].action == "block"


def test_not_applicable_is_recorded_in_ledger_and_checkpoint(h: Harness) -> None:
    h.knobs("alpha", applicable=False)
    result = h.run("alpha", "beta")
    assert result.success
    assert mat_metadata(result, "alpha")["resume/decision"] == "not_applicable"
    row = h.row("alpha")
    assert row is not None and row.status == "not_applicable"
    assert run_token_of(str(row.run_id)) == owner(result)
    envelope = h.envelope("alpha")
    assert (envelope["status"], envelope["data"]) == ("not_applicable", {})
    assert h.calls("alpha") == [] and h.provider_calls("alpha") == []
    assert [a.action for a in h.audit("alpha")] == ["not_applicable"]
    # downstream is judged on its own and sees the settled, not-applicable upstream
    assert h.envelope("beta")["data"]["items"][0] == "beta-empty"
    before = h.snapshot("alpha")
    assert h.run("alpha").success
    assert h.snapshot("alpha") == before  # identical content is never rewritten


def test_force_cleans_invalidates_downstream_and_marks_it(h: Harness) -> None:
    assert h.run("alpha", "beta", "gamma").success
    old = {s: h.path(s).read_bytes() for s in ("beta", "gamma")}

    result = h.run("alpha", tags=FORCE)
    assert result.success
    run = owner(result)
    meta = mat_metadata(result, "alpha")
    assert (meta["resume/decision"], meta["resume/reason"]) == (
        "force_explicit",
        "explicit force requested",
    )
    assert [run_token_of(c["run_id"]) for c in h.calls("alpha", "cleanup")] == [run]
    assert len(h.calls("alpha")) == 2
    for step_id in ("beta", "gamma"):
        row = h.row(step_id)
        assert row is not None and row.status == "stale"
        assert "invalidated by explicit force of alpha" in (row.result_summary or "")
        assert not h.path(step_id).exists()
        assert (h.path(step_id).parent / FORCE_MARKER).exists()
        assert old[step_id] in [p.read_bytes() for p in archives(h, step_id)]
        audit = h.audit(step_id)[-1]
        assert (
            audit.action,
            audit.from_status,
            audit.to_status,
            run_token_of(str(audit.run_id)),
        ) == (
            "invalidate",
            "completed",
            "stale",
            run,
        )
    assert [a.action for a in h.audit("alpha")][-2:] == ["force_explicit", "finish"]

    again = h.run("beta", "gamma")
    assert again.success
    for step_id in ("beta", "gamma"):
        assert mat_metadata(again, step_id)["resume/reason"] == (
            "auto recovery: invalidated by an explicit force upstream"
        )
        assert not (h.path(step_id).parent / FORCE_MARKER).exists()  # the save removed it
        row = h.row(step_id)
        assert row is not None and row.status == "completed"


def test_only_the_force_tag_forces(h: Harness) -> None:
    assert h.run("alpha", "beta").success
    result = h.run("alpha", tags={"resume/action": "force_explicit", "resume/mode": "resume-ish"})
    assert result.success
    assert mat_metadata(result, "alpha")["resume/decision"] == "skip"
    row = h.row("beta")
    assert row is not None and row.status == "completed"
    assert h.calls("alpha", "cleanup") == []


@pytest.mark.parametrize("path", ["rerun_self", "force_explicit"])
def test_both_finalize_paths_perform_all_seven_stages(h: Harness, path: str) -> None:
    """(1) execute (2) status (3) exit verify (4) owner-aware update (5) fenced publish
    (6) recovery bookkeeping (7) mutator hook — observed in rows, audit rows and files."""
    assert h.run("alpha", "beta").success
    h.knobs("gamma", fail="all")
    assert not h.run("gamma").success  # first run fails
    assert not h.run("gamma", tags=SENSOR_RUN).success  # one automatic recovery fails too
    row = h.row("gamma")
    assert row is not None
    assert (row.status, row.recovery_count) == ("failed", 1)
    assert row.retry_not_before is not None
    alpha_before = h.path("alpha").read_bytes()
    beta_before = (h.snapshot("beta"), h.row("beta"))
    h.knobs("gamma", fail=None, mutate="good")

    result = h.run("gamma", tags=FORCE if path == "force_explicit" else None)
    assert result.success
    run = owner(result)
    assert mat_metadata(result, "gamma")["resume/decision"] == path
    # (1) the body ran once in this run
    assert [run_token_of(c["run_id"]) for c in h.calls("gamma")][-1] == run
    assert len(h.calls("gamma")) == 3
    # (3) exit verification of what was published
    assert [(c["phase"], run_token_of(c["run_id"])) for c in h.calls("gamma", "verify")] == [
        ("exit", run)
    ]
    # (2)+(4) final status written by the owner
    row = h.row("gamma")
    assert row is not None
    assert (row.status, run_token_of(str(row.run_id)), row.error_message) == (
        "completed",
        run,
        None,
    )
    assert (row.applicable_count, row.completed_count, row.failed_count) == (2, 2, 0)
    assert row.completed_at is not None
    # (5) the checkpoint published is this run's
    envelope = h.envelope("gamma")
    assert (envelope["status"], run_token_of(envelope["produced_by"]["run_id"])) == (
        "completed",
        run,
    )
    assert envelope["content_hash"] == data_version(result, "gamma")
    # (6) recovery bookkeeping reset on success
    assert (row.recovery_count, row.retry_not_before, row.last_recovery_reason) == (
        0,
        None,
        None,
    )
    # (7) mutator hook: alpha edited in place, archived, recorded; never cascaded
    alpha = h.envelope("alpha")
    assert "reviewed-by-gamma" in alpha["data"]["items"]
    (mutation,) = alpha["mutations"]
    assert (mutation["by_step"], run_token_of(mutation["run_id"]), mutation["fields"]) == (
        "gamma",
        run,
        ["items"],
    )
    assert alpha_before in [p.read_bytes() for p in archives(h, "alpha")]
    alpha_audit = h.audit("alpha")[-1]
    assert (alpha_audit.action, run_token_of(str(alpha_audit.run_id))) == ("mutated", run)
    alpha_row = h.row("alpha")
    assert alpha_row is not None and alpha_row.status == "completed"
    assert (h.snapshot("beta"), h.row("beta")) == beta_before
    observed = [e.asset_key for e in result.get_asset_observation_events()]
    assert dg.AssetKey("alpha") in observed
    # the audit trail of gamma's finalize
    tail = [
        (a.action, a.from_status, a.to_status, run_token_of(str(a.run_id)))
        for a in h.audit("gamma")
    ]
    assert tail[-2:] == [(path, "failed", "running", run), ("finish", "running", "completed", run)]
    cleanups = [run_token_of(c["run_id"]) for c in h.calls("gamma", "cleanup")]
    assert cleanups == ([run] if path == "force_explicit" else [])
