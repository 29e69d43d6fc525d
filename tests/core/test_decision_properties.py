"""Properties of the judge over random states: invariants no table row may break."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_defs.resume.completion import CompletionReport, Origin
from pipeline_defs.resume.decision import decide
from pipeline_defs.resume.decision_types import (
    CheckpointSummary,
    LaunchMode,
    ResumeAction,
    ResumeDecision,
    ScopedConfig,
    config_hash,
)
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.resume.status import LedgerRow, StepStatus

BASE = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
STATUSES = ["running", "completed", "failed", "partial", "stale", "pending", "not_applicable"]


@dataclass(frozen=True)
class Step:
    step_id: str
    schema_version: int
    resume_config_keys: tuple[str, ...]
    allow_auto_rerun_on_schema_bump: bool


class CountingVerify:
    """Returns (or raises) a fixed outcome and counts calls."""

    def __init__(self, outcome: CompletionReport | Exception) -> None:
        self.outcome = outcome
        self.calls = 0

    def __call__(self) -> CompletionReport:
        self.calls += 1
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


moments = st.builds(
    lambda seconds: BASE + timedelta(seconds=seconds),
    st.floats(min_value=-3 * 86400, max_value=3 * 86400, allow_nan=False),
)


def _render(dt: datetime, style: str) -> str:
    if style == "z":
        return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if style == "offset":
        return dt.astimezone(timezone(timedelta(hours=-5, minutes=-30))).isoformat()
    return dt.astimezone(UTC).replace(tzinfo=None).isoformat()


timestamp_texts = st.one_of(
    st.none(),
    st.just(""),
    st.sampled_from(["garbage", "2026-99-99", "yesterday", "NaN"]),
    st.text(max_size=12),
    st.builds(_render, moments, st.sampled_from(["z", "offset", "naive"])),
)

rows = st.one_of(
    st.none(),
    st.builds(
        LedgerRow,
        status=st.one_of(st.sampled_from(STATUSES), st.text(max_size=6)),
        run_id=st.one_of(st.none(), st.text(min_size=1, max_size=10)),
        started_at=timestamp_texts,
        recovery_count=st.one_of(st.none(), st.integers(min_value=0, max_value=6)),
        last_recovery_reason=st.one_of(st.none(), st.text(max_size=20)),
        retry_not_before=timestamp_texts,
    ),
)

fingerprints = st.dictionaries(
    st.sampled_from(["model.t2i", "style.ratio", "lang"]),
    st.sampled_from(["fp1", "fp2"]),
    max_size=3,
)


@st.composite
def checkpoints(draw: st.DrawFn) -> CheckpointSummary:
    if not draw(st.booleans()):
        return CheckpointSummary.absent()
    fps = draw(fingerprints)
    return CheckpointSummary(
        present=True,
        schema_version=draw(st.one_of(st.none(), st.integers(1, 3))),
        status=draw(st.one_of(st.none(), st.sampled_from(STATUSES).map(StepStatus))),
        config_hash=draw(st.one_of(st.none(), st.just(config_hash(fps)), st.just("x"))),
        config_fingerprints=fps,
    )


outcomes = st.one_of(
    st.just(CompletionReport.clean()),
    st.sampled_from(
        [
            Origin.ARTIFACT_MISSING,
            Origin.INPUT_CHANGED,
            Origin.VICTIM_CHANGED,
            Origin.CONTRACT_DRIFT,
            Origin.INVARIANT_DRIFT,
            Origin.VERIFY_CRASHED,
        ]
    ).map(lambda o: CompletionReport.incomplete(o, missing=("thing",))),
    st.just(KeyError("boom")),
    st.just(PipelineError("io.integrity_violation", "bad card")),
)

steps = st.builds(
    Step,
    step_id=st.just("render_panels"),
    schema_version=st.integers(1, 3),
    resume_config_keys=st.just(("model.t2i",)),
    allow_auto_rerun_on_schema_bump=st.booleans(),
)

settings_strategy = st.builds(
    ResumeSettings,
    running_timeout_seconds=st.sampled_from([60, 3600, 86400]),
    max_recovery_attempts=st.integers(1, 4),
    retry_backoff_seconds=st.just(30),
)

states = st.fixed_dictionaries(
    {
        "mode": st.sampled_from(list(LaunchMode)),
        "applicable": st.booleans(),
        "row": rows,
        "checkpoint": checkpoints(),
        "outcome": outcomes,
        "step": steps,
        "config": fingerprints.map(ScopedConfig),
        "settings": settings_strategy,
        "now": moments,
    }
)


def run(state: dict[str, Any]) -> tuple[ResumeDecision, CountingVerify]:
    verify = CountingVerify(state["outcome"])
    kwargs = {k: v for k, v in state.items() if k != "outcome"}
    return decide(verify=verify, **kwargs), verify


COMMON = settings(max_examples=400, deadline=None)


@COMMON
@given(states)
def test_auto_mode_never_forces(state: dict[str, Any]) -> None:
    state["mode"] = LaunchMode.RESUME
    decision, _ = run(state)
    assert decision.action is not ResumeAction.FORCE_EXPLICIT


@COMMON
@given(states)
def test_force_when_applicable_always_forces(state: dict[str, Any]) -> None:
    state["mode"] = LaunchMode.FORCE
    state["applicable"] = True
    decision, verify = run(state)
    assert decision.action is ResumeAction.FORCE_EXPLICIT
    assert verify.calls == 0


@COMMON
@given(states)
def test_non_claiming_actions_carry_no_expected_fields(state: dict[str, Any]) -> None:
    decision, _ = run(state)
    if decision.action in {ResumeAction.BLOCK, ResumeAction.SKIP, ResumeAction.NOT_APPLICABLE}:
        assert decision.expected_started_at is None
        assert decision.expected_run_id is None
        assert not decision.claims
        assert decision.deferred_until is None


@COMMON
@given(states)
def test_stale_recovery_carries_the_row_texts(state: dict[str, Any]) -> None:
    decision, _ = run(state)
    if decision.action is ResumeAction.STALE_RUNNING_RECOVERY:
        row = state["row"]
        assert row is not None and row.status == "running"
        assert decision.expected_started_at is row.started_at
        assert decision.expected_run_id is row.run_id
        assert decision.auto_recovery


@COMMON
@given(states)
def test_deterministic(state: dict[str, Any]) -> None:
    first, _ = run(state)
    second, _ = run(state)
    assert first == second


@COMMON
@given(states)
def test_verify_called_at_most_once(state: dict[str, Any]) -> None:
    decision, verify = run(state)
    assert verify.calls <= 1
    if decision.action is ResumeAction.SKIP:
        assert verify.calls == 1


@COMMON
@given(states)
def test_blocks_have_a_known_code_and_exhaustion_respects_limit(state: dict[str, Any]) -> None:
    decision, _ = run(state)
    if decision.is_block:
        assert decision.code in {
            "step.resume_blocked",
            "step.verify_crashed",
            "step.recovery_exhausted",
            "step.already_running",
        }
    if decision.auto_recovery:
        row = state["row"]
        count = row.recovery_count if row is not None else 0
        assert count < state["settings"].max_recovery_attempts
