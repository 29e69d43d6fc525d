"""One case per row of docs/DESIGN.md#decision-table (plus boundaries); reports and clock."""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from pipeline_defs.resume.budget import Budget, CallCap
from pipeline_defs.resume.clock import MAX_CLOCK_SKEW, format_timestamp, parse_timestamp
from pipeline_defs.resume.completion import (
    ORIGIN_PRIORITY,
    CompletionReport,
    Origin,
    Severity,
    merge_reports,
    report_from_exception,
)
from pipeline_defs.resume.decision import decide
from pipeline_defs.resume.decision_types import (
    CheckpointSummary,
    InTheWay,
    LaunchMode,
    ResumeAction,
    ResumeDecision,
    ScopedConfig,
    config_hash,
)
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow, StepStatus

NOW = datetime(2026, 11, 30, 13, 0, 0, tzinfo=UTC)
SETTINGS = ResumeSettings()
TIMEOUT = timedelta(seconds=SETTINGS.running_timeout_seconds)
CONFIG = ScopedConfig({"model.t2i": "fp-a"})


@dataclass(frozen=True)
class Step:
    step_id: str = "render_panels"
    schema_version: int = 2
    resume_config_keys: tuple[str, ...] = ("model.t2i",)
    allow_auto_rerun_on_schema_bump: bool = False


class Verifier:
    """A verify callable that counts calls; when not ``allowed`` any call fails the test."""

    def __init__(self, result: CompletionReport | BaseException | None, allowed: bool) -> None:
        self.result = result
        self.allowed = allowed
        self.calls = 0

    def __call__(self) -> CompletionReport:
        self.calls += 1
        if not self.allowed:
            pytest.fail("verify must not be called for this table row")
        if isinstance(self.result, BaseException):
            raise self.result
        assert self.result is not None
        return self.result


def good_checkpoint(**overrides: Any) -> CheckpointSummary:
    values: dict[str, Any] = {
        "present": True,
        "schema_version": 2,
        "status": StepStatus.COMPLETED,
        "config_hash": CONFIG.hash,
        "config_fingerprints": dict(CONFIG.fingerprints),
    }
    values.update(overrides)
    return CheckpointSummary(**values)


def row(status: str, **overrides: Any) -> LedgerRow:
    values: dict[str, Any] = {
        "status": status,
        "run_id": "run-1:a1",
        "started_at": format_timestamp(NOW - timedelta(hours=5)),
        "recovery_count": 0,
        "last_recovery_reason": None,
        "retry_not_before": None,
    }
    values.update(overrides)
    return LedgerRow(**values)


def iso_z(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def iso_offset(dt: datetime) -> str:
    return dt.astimezone(timezone(timedelta(hours=2))).isoformat()


def iso_naive(dt: datetime) -> str:
    return dt.astimezone(UTC).replace(tzinfo=None).isoformat()


NO_VERIFY = None  # sentinel meaning "verify must not be called"
MISSING = CompletionReport.incomplete(Origin.ARTIFACT_MISSING, missing=("panel_1.png",))


@dataclass(frozen=True)
class Case:
    mode: LaunchMode = LaunchMode.RESUME
    applicable: bool = True
    row: LedgerRow | None = None
    checkpoint: CheckpointSummary = field(default_factory=good_checkpoint)
    verify: CompletionReport | BaseException | None = NO_VERIFY
    step: Step = field(default_factory=Step)
    # expectations
    action: ResumeAction = ResumeAction.SKIP
    origin: Origin | None = None
    code: str | None = None
    reason_has: tuple[str, ...] = ()
    first_run: bool = False
    adopt: bool = False
    auto_recovery: bool = False
    expected_started_at: str | None = None
    expected_run_id: str | None = None
    deferred_until: str | None = None


def running_case(
    started_at: Any, action: ResumeAction, code: str = "step.already_running", **kw: Any
) -> Case:
    r = row("running", started_at=started_at)
    extra: dict[str, Any] = {}
    if action is ResumeAction.STALE_RUNNING_RECOVERY:
        extra = {
            "expected_started_at": started_at,
            "expected_run_id": "run-1:a1",
            "auto_recovery": True,
        }
    else:
        extra = {"code": code}
    return Case(row=r, action=action, **extra, **kw)


STALE_AT = NOW - TIMEOUT
HEALTHY_AT = NOW - TIMEOUT + timedelta(microseconds=1)

CASES = [
    # Row 1
    pytest.param(
        Case(applicable=False, action=ResumeAction.NOT_APPLICABLE, reason_has=("not applicable",)),
        id="r1-not-applicable",
    ),
    pytest.param(
        Case(
            mode=LaunchMode.FORCE,
            applicable=False,
            row=row("running"),
            action=ResumeAction.NOT_APPLICABLE,
        ),
        id="r1-not-applicable-beats-force",
    ),
    # Row 2
    pytest.param(
        Case(
            mode=LaunchMode.FORCE,
            row=row("running", started_at=format_timestamp(NOW)),
            action=ResumeAction.FORCE_EXPLICIT,
            reason_has=("explicit force requested",),
        ),
        id="r2-force-over-healthy-running",
    ),
    pytest.param(
        Case(
            mode=LaunchMode.FORCE,
            row=row("completed", recovery_count=99),
            action=ResumeAction.FORCE_EXPLICIT,
        ),
        id="r2-force-ignores-recovery-limit",
    ),
    pytest.param(
        Case(
            mode=LaunchMode.FORCE,
            checkpoint=CheckpointSummary.absent(),
            action=ResumeAction.FORCE_EXPLICIT,
        ),
        id="r2-force-no-row",
    ),
    # Row 3
    pytest.param(
        Case(
            checkpoint=CheckpointSummary.absent(),
            action=ResumeAction.RERUN_SELF,
            first_run=True,
            reason_has=("first run",),
        ),
        id="r3-first-run",
    ),
    # Row 4
    pytest.param(
        Case(
            verify=CompletionReport.clean(),
            action=ResumeAction.SKIP,
            origin=Origin.CLEAN,
            adopt=True,
            reason_has=("adopts the verified checkpoint",),
        ),
        id="r4-orphan-clean-adopted",
    ),
    pytest.param(
        Case(
            checkpoint=good_checkpoint(status=None),
            verify=CompletionReport.clean(),
            action=ResumeAction.SKIP,
            origin=Origin.CLEAN,
            adopt=True,
        ),
        id="r4-orphan-status-none-means-completed",
    ),
    pytest.param(
        Case(
            verify=MISSING,
            action=ResumeAction.RERUN_SELF,
            origin=Origin.ARTIFACT_MISSING,
            auto_recovery=True,
            reason_has=("panel_1.png",),
        ),
        id="r4-orphan-artifact-missing",
    ),
    pytest.param(
        Case(
            checkpoint=good_checkpoint(schema_version=1),
            action=ResumeAction.BLOCK,
            origin=Origin.CONTRACT_DRIFT,
            code="step.resume_blocked",
        ),
        id="r4-orphan-schema-drift",
    ),
    pytest.param(
        Case(
            checkpoint=good_checkpoint(status=StepStatus.FAILED),
            action=ResumeAction.RERUN_SELF,
            auto_recovery=True,
            reason_has=("auto recovery from failed",),
        ),
        id="r4-orphan-failed",
    ),
    # Row 5
    *[
        pytest.param(
            running_case(
                raw,
                ResumeAction.BLOCK,
                code="step.resume_blocked",
                reason_has=("manual investigation required", repr(raw)),
            ),
            id=f"r5-started-at-{label}",
        )
        for label, raw in [("null", None), ("empty", ""), ("garbage", "garbage")]
    ],
    # Row 6 / 6b at the boundary and across formats
    pytest.param(
        running_case(
            iso_z(HEALTHY_AT), ResumeAction.BLOCK, reason_has=("running healthy", "run-1:a1")
        ),
        id="r6-healthy-timeout-minus-1us-z",
    ),
    pytest.param(
        running_case(
            iso_z(STALE_AT),
            ResumeAction.STALE_RUNNING_RECOVERY,
            reason_has=("recovering the expired lease",),  # "stale" is an invalidated row
        ),
        id="r6b-stale-at-exact-timeout-z",
    ),
    pytest.param(
        running_case(iso_offset(HEALTHY_AT), ResumeAction.BLOCK, reason_has=("running healthy",)),
        id="r6-healthy-timeout-minus-1us-offset",
    ),
    pytest.param(
        running_case(iso_offset(STALE_AT), ResumeAction.STALE_RUNNING_RECOVERY),
        id="r6b-stale-at-exact-timeout-offset",
    ),
    pytest.param(
        running_case(iso_naive(HEALTHY_AT), ResumeAction.BLOCK, reason_has=("running healthy",)),
        id="r6-healthy-timeout-minus-1us-naive",
    ),
    pytest.param(
        running_case(iso_naive(STALE_AT), ResumeAction.STALE_RUNNING_RECOVERY),
        id="r6b-stale-at-exact-timeout-naive",
    ),
    pytest.param(
        running_case("2026-11-30T10:00:00+02:00", ResumeAction.STALE_RUNNING_RECOVERY),
        id="r6b-stale-raw-text-not-reformatted",
    ),
    pytest.param(
        running_case(iso_z(NOW + timedelta(minutes=5)), ResumeAction.BLOCK),
        id="r6-started-in-future-is-healthy",
    ),
    # Row 5 for the heartbeat: one stamped beyond the allowed clock skew ahead
    # never ages into the lease, so it is no healthy lease but a row to investigate, as a
    # future started_at is; within the skew it is another host's clock running a little fast.
    *[
        pytest.param(
            Case(
                row=row("running", heartbeat_at=beat),
                action=ResumeAction.BLOCK,
                code="step.resume_blocked",
                reason_has=("heartbeat_at", repr(beat), "in the future", "manual investigation"),
            ),
            id=f"r5-heartbeat-{label}",
        )
        for label, beat in [
            ("skew-plus-1s", iso_z(NOW + MAX_CLOCK_SKEW + timedelta(seconds=1))),
            ("year-9999", "9999-12-31T23:59:59.999999Z"),
        ]
    ],
    pytest.param(
        Case(
            row=row("running", heartbeat_at=iso_z(NOW + MAX_CLOCK_SKEW)),
            action=ResumeAction.BLOCK,
            code="step.already_running",
            reason_has=("running healthy",),
        ),
        id="r6-heartbeat-exactly-the-skew-ahead-is-healthy",
    ),
    # Row 7
    pytest.param(
        Case(
            row=row("completed"),
            checkpoint=CheckpointSummary.absent(),
            action=ResumeAction.RERUN_SELF,
            origin=Origin.ARTIFACT_MISSING,
            auto_recovery=True,
        ),
        id="r7-completed-checkpoint-absent",
    ),
    # Row 8
    pytest.param(
        Case(
            row=row("completed"),
            checkpoint=good_checkpoint(schema_version=1),
            action=ResumeAction.BLOCK,
            origin=Origin.CONTRACT_DRIFT,
            code="step.resume_blocked",
            reason_has=("schema_version 1", "schema_version 2", "resume/mode=force"),
        ),
        id="r8-schema-bump-blocked",
    ),
    pytest.param(
        Case(
            row=row("completed"),
            checkpoint=good_checkpoint(schema_version=1),
            step=Step(allow_auto_rerun_on_schema_bump=True),
            action=ResumeAction.RERUN_SELF,
            origin=Origin.CONTRACT_DRIFT,
            auto_recovery=True,
        ),
        id="r8-schema-bump-allow-listed",
    ),
    # Row 9
    pytest.param(
        Case(
            row=row("completed"),
            checkpoint=good_checkpoint(
                config_hash=config_hash({"model.t2i": "fp-OLD"}),
                config_fingerprints={"model.t2i": "fp-OLD"},
            ),
            action=ResumeAction.BLOCK,
            origin=Origin.CONTRACT_DRIFT,
            code="step.resume_blocked",
            reason_has=("model.t2i", "resume/mode=force"),
        ),
        id="r9-config-drift-names-key",
    ),
    pytest.param(
        Case(
            row=row("completed"),
            checkpoint=good_checkpoint(
                config_hash=config_hash({"model.t2i": "fp-a", "style.ratio": "x"}),
                config_fingerprints={"model.t2i": "fp-a", "style.ratio": "x"},
            ),
            action=ResumeAction.BLOCK,
            origin=Origin.CONTRACT_DRIFT,
            code="step.resume_blocked",
            reason_has=("keys: style.ratio",),
        ),
        id="r9-config-drift-removed-key",
    ),
    pytest.param(
        Case(
            row=row("completed"),
            checkpoint=good_checkpoint(config_hash="deadbeef", config_fingerprints={}),
            action=ResumeAction.BLOCK,
            origin=Origin.CONTRACT_DRIFT,
            code="step.resume_blocked",
            reason_has=("scoped config hash changed", "model.t2i"),
        ),
        id="r9-config-drift-without-fingerprints",
    ),
    # Row 10
    pytest.param(
        Case(
            row=row("completed"),
            verify=CompletionReport.clean(),
            action=ResumeAction.SKIP,
            origin=Origin.CLEAN,
        ),
        id="r10-clean-skip",
    ),
    pytest.param(
        Case(
            row=row("completed"),
            verify=CompletionReport.incomplete(
                Origin.ARTIFACT_MISSING, missing=tuple(f"p{i}.png" for i in range(8))
            ),
            action=ResumeAction.RERUN_SELF,
            origin=Origin.ARTIFACT_MISSING,
            auto_recovery=True,
            reason_has=("p0.png", "p4.png", "3 more"),
        ),
        id="r10-artifact-missing-rerun",
    ),
    pytest.param(
        Case(
            row=row("completed"),
            verify=CompletionReport.incomplete(Origin.CONTRACT_DRIFT, missing=("validator",)),
            action=ResumeAction.BLOCK,
            origin=Origin.CONTRACT_DRIFT,
            code="step.resume_blocked",
            reason_has=("validator",),
        ),
        id="r10-contract-drift-block",
    ),
    pytest.param(
        Case(
            row=row("completed"),
            verify=CompletionReport.incomplete(
                Origin.INVARIANT_DRIFT, missing=("t2i_prompt_hash",)
            ),
            action=ResumeAction.BLOCK,
            origin=Origin.INVARIANT_DRIFT,
            code="step.resume_blocked",
            reason_has=("invariant_drift", "t2i_prompt_hash"),
        ),
        id="r10-invariant-drift-block",
    ),
    pytest.param(
        Case(
            row=row("completed"),
            verify=CompletionReport.incomplete(Origin.VERIFY_CRASHED, error="boom"),
            action=ResumeAction.BLOCK,
            origin=Origin.VERIFY_CRASHED,
            code="step.verify_crashed",
            reason_has=("boom",),
        ),
        id="r10-verify-crashed-report",
    ),
    pytest.param(
        Case(
            row=row("completed"),
            verify=KeyError("panel_id"),
            action=ResumeAction.BLOCK,
            origin=Origin.VERIFY_CRASHED,
            code="step.verify_crashed",
            reason_has=("KeyError", "panel_id"),
        ),
        id="r10-verify-raises-keyerror",
    ),
    pytest.param(
        Case(
            row=row("completed"),
            verify=PipelineError("io.integrity_violation", "card field absent"),
            action=ResumeAction.BLOCK,
            origin=Origin.CONTRACT_DRIFT,
            code="step.resume_blocked",
            reason_has=("io.integrity_violation", "card field absent"),
        ),
        id="r10-verify-raises-pipeline-error",
    ),
    # Row 11
    *[
        pytest.param(
            Case(
                row=row(status),
                action=ResumeAction.RERUN_SELF,
                auto_recovery=True,
                reason_has=(f"auto recovery from {status}",),
            ),
            id=f"r11-{status}",
        )
        for status in ("failed", "partial", "pending", "not_applicable", "weird")
    ],
    # The ledger's "stale" is a row a force invalidated: its reason says so, and never calls
    # it stale (operators read "stale" as a lapsed lease).
    pytest.param(
        Case(
            row=row("stale"),
            action=ResumeAction.RERUN_SELF,
            auto_recovery=True,
            reason_has=("auto recovery: invalidated by an explicit force upstream",),
        ),
        id="r11-stale-is-invalidated",
    ),
    # Row 12
    pytest.param(
        Case(
            row=row("failed", recovery_count=2),
            action=ResumeAction.RERUN_SELF,
            auto_recovery=True,
        ),
        id="r12-below-limit",
    ),
    pytest.param(
        Case(
            row=row("failed", recovery_count=3, last_recovery_reason="auto recovery from failed"),
            action=ResumeAction.BLOCK,
            code="step.recovery_exhausted",
            reason_has=("3", "auto recovery from failed"),
        ),
        id="r12-exhausted-at-3",
    ),
    pytest.param(
        Case(
            row=row("completed", recovery_count=3, last_recovery_reason="artifact gone"),
            checkpoint=CheckpointSummary.absent(),
            action=ResumeAction.BLOCK,
            origin=Origin.ARTIFACT_MISSING,
            code="step.recovery_exhausted",
            reason_has=("artifact gone",),
        ),
        id="r12-exhausted-keeps-origin",
    ),
    pytest.param(
        Case(
            row=row("running", started_at=iso_z(STALE_AT), recovery_count=3),
            action=ResumeAction.BLOCK,
            code="step.recovery_exhausted",
        ),
        id="r12-exhausted-stale-running",
    ),
    pytest.param(
        Case(
            row=row("completed", recovery_count=7),
            verify=CompletionReport.clean(),
            action=ResumeAction.SKIP,
            origin=Origin.CLEAN,
        ),
        id="r12-skip-is-not-limited",
    ),
    # Row 13
    pytest.param(
        Case(
            row=row("failed", retry_not_before="2026-11-30T13:00:30Z"),
            action=ResumeAction.RERUN_SELF,
            auto_recovery=True,
            deferred_until="2026-11-30T13:00:30Z",
        ),
        id="r13-backoff-in-future-deferred",
    ),
    pytest.param(
        Case(
            row=row("failed", retry_not_before=format_timestamp(NOW)),
            action=ResumeAction.RERUN_SELF,
            auto_recovery=True,
        ),
        id="r13-backoff-equal-now-not-deferred",
    ),
    pytest.param(
        Case(
            row=row("failed", retry_not_before="2026-11-30T12:59:59Z"),
            action=ResumeAction.RERUN_SELF,
            auto_recovery=True,
        ),
        id="r13-backoff-in-past-not-deferred",
    ),
    pytest.param(
        Case(
            row=row("failed", retry_not_before="soon"),
            action=ResumeAction.RERUN_SELF,
            auto_recovery=True,
        ),
        id="r13-backoff-garbage-ignored",
    ),
    pytest.param(
        Case(
            row=row("failed", recovery_count=3, retry_not_before="2026-11-30T14:00:00Z"),
            action=ResumeAction.BLOCK,
            code="step.recovery_exhausted",
        ),
        id="r13-blocked-never-deferred",
    ),
    pytest.param(
        Case(
            row=row("completed", retry_not_before="2026-11-30T14:00:00Z"),
            verify=CompletionReport.clean(),
            action=ResumeAction.SKIP,
            origin=Origin.CLEAN,
        ),
        id="r13-skip-never-deferred",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_decision_table(case: Case) -> None:
    verifier = Verifier(case.verify, allowed=case.verify is not NO_VERIFY)
    decision = decide(
        mode=case.mode,
        applicable=case.applicable,
        row=case.row,
        checkpoint=case.checkpoint,
        verify=verifier,
        step=case.step,
        config=CONFIG,
        settings=SETTINGS,
        now=NOW,
    )
    assert decision.action is case.action, decision.reason
    assert decision.origin == case.origin
    assert decision.code == case.code
    assert decision.first_run is case.first_run
    assert decision.adopt is case.adopt
    assert decision.auto_recovery is case.auto_recovery
    assert decision.expected_started_at == case.expected_started_at
    assert decision.expected_run_id == case.expected_run_id
    assert decision.deferred_until == case.deferred_until
    for fragment in case.reason_has:
        assert fragment in decision.reason
    assert verifier.calls == (0 if case.verify is NO_VERIFY else 1)
    assert decision.claims is (decision.action in _CLAIMS)
    assert decision.is_block is (decision.action is ResumeAction.BLOCK)


_CLAIMS = {
    ResumeAction.RERUN_SELF,
    ResumeAction.FORCE_EXPLICIT,
    ResumeAction.STALE_RUNNING_RECOVERY,
}


def test_stale_expected_fields_are_the_row_objects() -> None:
    r = row("running", started_at="2026-11-30 10:00:00", run_id="run-x")
    decision = decide(
        mode=LaunchMode.RESUME,
        applicable=True,
        row=r,
        checkpoint=good_checkpoint(),
        verify=Verifier(None, allowed=False),
        step=Step(),
        config=CONFIG,
        settings=SETTINGS,
        now=NOW,
    )
    assert decision.action is ResumeAction.STALE_RUNNING_RECOVERY
    assert decision.expected_started_at == "2026-11-30 10:00:00"
    assert decision.expected_run_id == "run-x"


def test_custom_timeout_and_limit() -> None:
    settings = ResumeSettings(running_timeout_seconds=60, max_recovery_attempts=1)
    base: dict[str, Any] = {
        "mode": LaunchMode.RESUME,
        "applicable": True,
        "checkpoint": good_checkpoint(),
        "verify": Verifier(None, allowed=False),
        "step": Step(),
        "config": CONFIG,
        "settings": settings,
        "now": NOW,
    }
    started = format_timestamp(NOW - timedelta(seconds=60))
    stale = decide(row=row("running", started_at=started), **base)
    assert stale.action is ResumeAction.STALE_RUNNING_RECOVERY
    exhausted = decide(row=row("failed", recovery_count=1), **base)
    assert exhausted.code == "step.recovery_exhausted"


def test_mode_accepts_plain_string() -> None:
    decision = decide(
        mode="force",  # type: ignore[arg-type]
        applicable=True,
        row=None,
        checkpoint=CheckpointSummary.absent(),
        verify=Verifier(None, allowed=False),
        step=Step(),
        config=CONFIG,
        settings=SETTINGS,
        now=NOW,
    )
    assert decision.action is ResumeAction.FORCE_EXPLICIT


def test_verify_returning_wrong_type_is_a_crash() -> None:
    bad: Callable[[], Any] = lambda: {"ok": True}  # noqa: E731
    decision = decide(
        mode=LaunchMode.RESUME,
        applicable=True,
        row=row("completed"),
        checkpoint=good_checkpoint(),
        verify=bad,
        step=Step(),
        config=CONFIG,
        settings=SETTINGS,
        now=NOW,
    )
    assert decision.code == "step.verify_crashed"


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"action": ResumeAction.BLOCK}, id="block-without-code"),
        pytest.param({"action": ResumeAction.SKIP, "code": "step.resume_blocked"}, id="skip-code"),
        pytest.param(
            {"action": ResumeAction.SKIP, "expected_run_id": "r"}, id="skip-expected-run-id"
        ),
        pytest.param(
            {
                "action": ResumeAction.BLOCK,
                "code": "step.resume_blocked",
                "expected_started_at": "t",
            },
            id="block-expected-started-at",
        ),
        pytest.param({"action": ResumeAction.RERUN_SELF, "adopt": True}, id="adopt-on-rerun"),
        pytest.param({"action": ResumeAction.SKIP, "first_run": True}, id="first-run-on-skip"),
        pytest.param(
            {"action": ResumeAction.RERUN_SELF, "deferred_until": "t"}, id="deferred-not-auto"
        ),
    ],
)
def test_decision_rejects_impossible_combinations(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ResumeDecision(reason="x", **kwargs)


# ---- scoped config ------------------------------------------------------------------


def test_config_hash_is_order_independent_and_defined_for_empty() -> None:
    assert config_hash({"a": "1", "b": "2"}) == config_hash({"b": "2", "a": "1"})
    assert config_hash({"a": "1"}) != config_hash({"a": "2"})
    assert ScopedConfig({}).hash == config_hash({}) == ScopedConfig().hash
    assert len(config_hash({})) == 64


def test_checkpoint_without_hash_is_judged_by_its_fingerprints() -> None:
    decision = decide(
        mode=LaunchMode.RESUME,
        applicable=True,
        row=row("completed"),
        checkpoint=good_checkpoint(config_hash=None),
        verify=Verifier(CompletionReport.clean(), allowed=True),
        step=Step(),
        config=CONFIG,
        settings=SETTINGS,
        now=NOW,
    )
    assert decision.action is ResumeAction.SKIP


# ---- completion reports -------------------------------------------------------------


def test_report_defaults() -> None:
    ok = CompletionReport(is_complete=True)
    assert (ok.origin, ok.severity, ok.missing) == (Origin.CLEAN, Severity.CLEAN, ())
    bad = CompletionReport(is_complete=False, missing=["a.png"])  # type: ignore[arg-type]
    assert (bad.origin, bad.severity, bad.missing) == (
        Origin.ARTIFACT_MISSING,
        Severity.MISSING,
        ("a.png",),
    )
    assert CompletionReport.clean(count=3).metadata == {"count": 3}
    inc = CompletionReport.incomplete(Origin.INVARIANT_DRIFT, ["h"], Severity.PARTIAL, n=1)
    assert (inc.origin, inc.severity, inc.missing, inc.metadata) == (
        Origin.INVARIANT_DRIFT,
        Severity.PARTIAL,
        ("h",),
        {"n": 1},
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"is_complete": True, "origin": Origin.CONTRACT_DRIFT}, id="complete-drift"),
        pytest.param({"is_complete": False, "origin": Origin.CLEAN}, id="incomplete-clean"),
        pytest.param({"is_complete": True, "severity": Severity.PARTIAL}, id="complete-partial"),
        pytest.param({"is_complete": False, "severity": Severity.CLEAN}, id="incomplete-sev-clean"),
    ],
)
def test_inconsistent_reports_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        CompletionReport(**kwargs)


def test_incomplete_with_clean_origin_rejected() -> None:
    with pytest.raises(ValueError):
        CompletionReport.incomplete(Origin.CLEAN)


def test_origin_priority_order() -> None:
    ranked = sorted(Origin, key=ORIGIN_PRIORITY.__getitem__, reverse=True)
    assert ranked == [
        Origin.VERIFY_CRASHED,
        Origin.CONTRACT_DRIFT,
        Origin.INVARIANT_DRIFT,
        Origin.ARTIFACT_MISSING,
        Origin.INPUT_CHANGED,
        Origin.VICTIM_CHANGED,
        Origin.CLEAN,
    ]


def test_merge_reports_priority_union_and_severity() -> None:
    merged = merge_reports(
        CompletionReport.incomplete(Origin.ARTIFACT_MISSING, ["a", "b"], Severity.PARTIAL, x=1),
        CompletionReport.clean(y=2),
        CompletionReport.incomplete(Origin.INVARIANT_DRIFT, ["b", "c"], Severity.PARTIAL, x=3),
    )
    assert merged.origin is Origin.INVARIANT_DRIFT
    assert merged.missing == ("a", "b", "c")
    assert merged.severity is Severity.PARTIAL
    assert merged.metadata == {"x": 3, "y": 2}
    assert not merged.is_complete

    worst = merge_reports(
        CompletionReport.incomplete(Origin.CONTRACT_DRIFT, ["k"]),
        CompletionReport.incomplete(Origin.VERIFY_CRASHED, severity=Severity.PARTIAL),
    )
    assert worst.origin is Origin.VERIFY_CRASHED
    assert worst.severity is Severity.MISSING


def test_merge_reports_empty_and_all_clean() -> None:
    assert merge_reports() == CompletionReport.clean()
    both = merge_reports(CompletionReport.clean(a=1), CompletionReport.clean(b=2))
    assert both.is_complete and both.origin is Origin.CLEAN and both.metadata == {"a": 1, "b": 2}


def test_report_from_exception() -> None:
    typed = report_from_exception(PipelineError("io.integrity_violation", "hash mismatch"))
    assert typed.origin is Origin.CONTRACT_DRIFT
    assert typed.missing == ("io.integrity_violation",)
    assert typed.metadata["error"] == "hash mismatch"
    crashed = report_from_exception(KeyError("panel"))
    assert crashed.origin is Origin.VERIFY_CRASHED
    assert crashed.metadata["error"] == "KeyError: 'panel'"


# ---- clock --------------------------------------------------------------------------

EXPECTED = datetime(2026, 11, 30, 13, 7, 15, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("2026-11-30T13:07:15.123456Z", id="z"),
        pytest.param("2026-11-30T15:07:15.123456+02:00", id="offset"),
        pytest.param("2026-11-30T13:07:15.123456", id="naive"),
        pytest.param("2026-11-30 13:07:15.123456+00:00", id="space-separator"),
        pytest.param("  2026-11-30T13:07:15.123456Z ", id="whitespace"),
    ],
)
def test_parse_timestamp_formats(text: str) -> None:
    parsed = parse_timestamp(text)
    assert parsed == EXPECTED
    assert parsed is not None and parsed.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "text",
    [None, "", "   ", "garbage", "2026-13-45T00:00:00Z", "0001-01-01T00:00:00+05:00", 42],
)
def test_parse_timestamp_never_raises(text: Any) -> None:
    assert parse_timestamp(text) is None


def test_format_timestamp() -> None:
    assert format_timestamp(EXPECTED) == "2026-11-30T13:07:15.123456Z"
    assert format_timestamp(datetime(2026, 1, 2, 3, 4, 5)) == "2026-01-02T03:04:05.000000Z"
    plus2 = datetime(2026, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    assert format_timestamp(plus2) == "2026-01-02T03:04:05.000000Z"
    assert parse_timestamp(format_timestamp(EXPECTED)) == EXPECTED


def _in_the_way_base() -> dict[str, Any]:
    return {
        "mode": LaunchMode.RESUME,
        "applicable": True,
        "step": Step(),
        "config": CONFIG,
        "settings": SETTINGS,
        "now": NOW,
    }


def test_what_stands_in_the_write_path_is_a_fact_of_decide() -> None:
    """Something in the way of a claiming run comes out of decide() as its block; a probe
    is asked only for a decision that would claim, once, with the action and whether it is
    an automatic re-run (an older copy is a block only then)."""
    asked: list[tuple[ResumeAction, bool]] = []
    dir_in_the_way = PipelineError("io.integrity_violation", "a directory where C01.png goes")

    def probe(action: ResumeAction, auto_recovery: bool) -> PipelineError | None:
        asked.append((action, auto_recovery))
        return dir_in_the_way

    rerun = decide(
        row=row("failed"),
        checkpoint=CheckpointSummary.absent(),
        verify=Verifier(None, allowed=False),
        in_the_way=InTheWay(probe=probe),
        **_in_the_way_base(),
    )
    assert rerun.action is ResumeAction.BLOCK and rerun.code == "step.resume_blocked"
    assert rerun.reason == dir_in_the_way.message
    assert asked == [(ResumeAction.RERUN_SELF, True)]
    skip = decide(
        row=row("completed"),
        checkpoint=good_checkpoint(),
        verify=Verifier(CompletionReport.clean(), allowed=True),
        in_the_way=InTheWay(probe=probe),
        **_in_the_way_base(),
    )
    assert skip.action is ResumeAction.SKIP and len(asked) == 1  # no probe for a SKIP


def test_a_link_where_the_checkpoint_should_be_blocks_whatever_the_row_says() -> None:
    link = PipelineError("checkpoint.symlink", "checkpoint.json is a symbolic link")
    for status in ("failed", "stale", "completed"):
        decision = decide(
            row=row(status),
            checkpoint=CheckpointSummary.absent(),
            verify=Verifier(CompletionReport.clean(), allowed=True),
            in_the_way=InTheWay(unreadable=link, probe=lambda *_: pytest.fail("no probe")),
            **_in_the_way_base(),
        )
        assert decision.action is ResumeAction.BLOCK, status
        assert decision.origin is Origin.CONTRACT_DRIFT and decision.reason == link.message


# ---------------------------------------------------------------- row 14: the spend cap
class Spent:
    """The episode's recorded calls, counting how often the judge asked."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.asked = 0

    def __call__(self) -> int:
        self.asked += 1
        return self.value


def _budget(spent: Spent, limit: int = 10) -> Budget:
    return Budget(lambda: CallCap(limit, "ledger"), spent, "p", "e")


def _judge(
    mode: LaunchMode,
    the_row: LedgerRow | None,
    checkpoint: CheckpointSummary,
    spent: Spent,
) -> ResumeDecision:
    return decide(
        mode=mode,
        applicable=True,
        row=the_row,
        checkpoint=checkpoint,
        verify=Verifier(CompletionReport.clean(), allowed=True),
        step=Step(),
        config=CONFIG,
        settings=SETTINGS,
        now=NOW,
        budget=_budget(spent),
    )


@pytest.mark.parametrize(
    ("mode", "status", "checkpoint"),
    [
        (LaunchMode.RESUME, None, CheckpointSummary.absent()),  # a first run
        (LaunchMode.RESUME, StepStatus.FAILED, good_checkpoint()),  # an automatic recovery
        (LaunchMode.FORCE, StepStatus.COMPLETED, good_checkpoint()),  # blocked before cleanup
        (LaunchMode.REDRAW, StepStatus.COMPLETED, good_checkpoint()),
    ],
)
def test_row_14_a_claim_at_the_cap_is_blocked_with_the_raise_command(
    mode: LaunchMode, status: StepStatus | None, checkpoint: CheckpointSummary
) -> None:
    """Before: no budget fact; each of these claimed and then paid (or failed paying)."""
    the_row = row(status) if status is not None else None
    spent = Spent(10)
    decision = _judge(mode, the_row, checkpoint, spent)
    assert decision.action is ResumeAction.BLOCK and decision.code == "budget.exhausted"
    assert "recorded 10 provider calls, at its cap of 10" in decision.reason
    assert "storyboard settings set max_calls_per_episode 20" in decision.reason
    assert spent.asked == 1
    below = Spent(9)
    assert _judge(mode, the_row, checkpoint, below).claims  # one call left: it may claim


def test_row_14_reads_the_spend_only_for_a_claim() -> None:
    """A clean SKIP at (or past) the cap stays a SKIP, and the count is never read."""
    spent = Spent(50)
    decision = _judge(LaunchMode.RESUME, row(StepStatus.COMPLETED), good_checkpoint(), spent)
    assert decision.action is ResumeAction.SKIP and spent.asked == 0
