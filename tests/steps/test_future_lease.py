"""A running row whose started_at lies in the future is not a healthy lease.

``elapsed = now - started_at`` is negative for such a row and never reaches the timeout,
so before the fix the judge called it "running healthy" forever: no recovery, no block
an operator would look at. Beyond the allowed clock skew it is judged like an unparseable
started_at (BLOCK, manual investigation), and ``storyboard audit-running`` says so.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from cli_helpers import CliEnv

from pipeline_defs.judging.wake import next_wake
from pipeline_defs.resume.clock import MAX_CLOCK_SKEW, format_timestamp
from pipeline_defs.resume.completion import CompletionReport
from pipeline_defs.resume.decision import decide
from pipeline_defs.resume.decision_types import (
    CheckpointSummary,
    LaunchMode,
    ResumeAction,
    ResumeDecision,
    ScopedConfig,
)
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow
from resources.ledger.tables import step_run

NOW = datetime(2026, 11, 30, 13, 0, 0, tzinfo=UTC)
SETTINGS = ResumeSettings()


class _Step:
    step_id = "render_panels"
    schema_version = 1
    resume_config_keys: tuple[str, ...] = ()
    allow_auto_rerun_on_schema_bump = False


def _never_verify() -> CompletionReport:
    pytest.fail("a running row is judged without verification")


def judge(started_at: Any, mode: LaunchMode = LaunchMode.RESUME) -> ResumeDecision:
    return decide(
        mode=mode,
        applicable=True,
        row=LedgerRow(
            status="running",
            run_id="run-1:a1",
            started_at=started_at,
            recovery_count=0,
            last_recovery_reason=None,
            retry_not_before=None,
        ),
        checkpoint=CheckpointSummary.absent(),
        verify=_never_verify,
        step=_Step(),
        config=ScopedConfig(),
        settings=SETTINGS,
        now=NOW,
    )


def test_the_allowed_skew_is_five_minutes() -> None:
    assert timedelta(seconds=300) == MAX_CLOCK_SKEW


@pytest.mark.parametrize(
    "started_at",
    [
        pytest.param(format_timestamp(NOW + MAX_CLOCK_SKEW + timedelta(seconds=1)), id="skew+1s"),
        pytest.param(format_timestamp(NOW + timedelta(days=365)), id="next-year"),
        pytest.param("9999-12-31T23:59:59.999999Z", id="year-9999"),
        pytest.param(
            (NOW + timedelta(hours=3)).astimezone(UTC).replace(tzinfo=None).isoformat(),
            id="naive-3h-ahead",
        ),
    ],
)
def test_started_at_beyond_the_skew_blocks_for_manual_investigation(started_at: str) -> None:
    decision = judge(started_at)
    assert decision.action is ResumeAction.BLOCK
    assert decision.code == "step.resume_blocked"
    assert "manual investigation required" in decision.reason
    assert "in the future" in decision.reason
    assert repr(started_at) in decision.reason
    assert "run-1:a1" in decision.reason
    assert not decision.claims and not decision.auto_recovery


@pytest.mark.parametrize(
    "ahead",
    [timedelta(0), timedelta(seconds=1), timedelta(seconds=120), MAX_CLOCK_SKEW],
    ids=["now", "1s", "2min", "exactly-the-skew"],
)
def test_started_at_within_the_skew_is_still_a_healthy_lease(ahead: timedelta) -> None:
    """Another host's clock may run a little ahead: that owner is alive, not suspicious."""
    decision = judge(format_timestamp(NOW + ahead))
    assert decision.action is ResumeAction.BLOCK
    assert decision.code == "step.already_running"
    assert "running healthy" in decision.reason


def test_force_still_overrides_a_future_started_at() -> None:
    decision = judge("9999-12-31T23:59:59Z", mode=LaunchMode.FORCE)
    assert decision.action is ResumeAction.FORCE_EXPLICIT


# --------------------------------------------------------------------------- audit-running
def _set_started_at(url: str, key: StepKey, value: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sa.update(step_run)
            .where(
                step_run.c.project_id == key.project_id,
                step_run.c.episode_id == key.episode_id,
                step_run.c.step_id == key.step_id,
            )
            .values(started_at=value)
        )
    engine.dispose()


def test_audit_running_classifies_a_future_started_at_as_future(cli_db: CliEnv) -> None:
    cli = cli_db
    cli.ok("migrate")
    ledger = cli.ledger
    now = datetime.now(UTC)
    healthy = StepKey("p1", "e1", "outline")
    slightly_ahead = StepKey("p1", "e2", "outline")
    ahead = StepKey("p1", "e3", "outline")
    far = StepKey("p1", "e4", "outline")
    ledger.claim(healthy, "r1:0", now=format_timestamp(now - timedelta(seconds=30)))
    ledger.claim(slightly_ahead, "r2:0", now=format_timestamp(now + timedelta(seconds=60)))
    ledger.claim(ahead, "r3:0", now=format_timestamp(now + timedelta(hours=2)))
    ledger.claim(far, "r4:0")
    _set_started_at(cli.db_url, far, "9999-12-31T23:59:59.000000Z")

    payload = cli.json("audit-running")
    rows = {r["partition"]: r for r in payload["running"]}
    assert rows["p1/e1"]["bucket"] == "healthy"
    assert rows["p1/e2"]["bucket"] == "healthy"  # within the allowed clock skew
    for partition in ("p1/e3", "p1/e4"):
        row = rows[partition]
        assert row["bucket"] == "future", row
        assert row["elapsed_seconds"] < 0
        assert "in the future" in row["hint"]
        assert "reset-running" in row["hint"] and "--expected-started-at" in row["hint"]
    assert rows["p1/e4"]["started_at"] == "9999-12-31T23:59:59.000000Z"
    assert payload["counts"]["future"] == 2
    assert payload["counts"]["healthy"] == 2
    text = cli.ok("audit-running").stdout
    assert "future 2" in text and "9999-12-31" in text


def test_the_sensor_wake_time_survives_a_year_9999_lease() -> None:
    """``started_at + timeout`` past ``datetime.max`` must not fail the sensor's tick."""
    now = datetime(2026, 12, 1, tzinfo=UTC)
    rows = [LedgerRow(status="running", started_at="9999-12-31T23:59:59+00:00")]
    wake = next_wake(rows, ResumeSettings(), now)
    # The lease turns from "investigate" to healthy once it is within the allowed skew.
    assert wake is not None and wake.year == 9999
