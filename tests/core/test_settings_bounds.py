"""Settings that used to validate and then break later are refused when settings are read.

A running timeout of 10**22 s passed validation and then raised OverflowError inside the
judge (``timedelta``), a huge backoff overflowed ``now + backoff`` at the first failure,
and ``PIPELINE_OFFLINE_LATENCY_MS=abc`` only failed at the first provider call of a run.
"""

from datetime import UTC, datetime, timedelta

import pytest

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.completion import CompletionReport
from pipeline_defs.resume.decision import decide
from pipeline_defs.resume.decision_types import (
    CheckpointSummary,
    LaunchMode,
    ResumeAction,
    ScopedConfig,
)
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.settings import (
    ENV_NAMES,
    MAX_OFFLINE_LATENCY_MS,
    MAX_RECOVERY_ATTEMPTS,
    MAX_SETTING_SECONDS,
    ResumeSettings,
)
from pipeline_defs.resume.status import LedgerRow

NOW = datetime(2026, 11, 30, 13, 0, 0, tzinfo=UTC)
THIRTY_DAYS = 30 * 24 * 3600


class _Step:
    step_id = "render_panels"
    schema_version = 1
    resume_config_keys: tuple[str, ...] = ()
    allow_auto_rerun_on_schema_bump = False


def _judge_running(settings: ResumeSettings, started_at: str) -> ResumeAction:
    decision = decide(
        mode=LaunchMode.RESUME,
        applicable=True,
        row=LedgerRow(status="running", run_id="r:1", started_at=started_at, recovery_count=0),
        checkpoint=CheckpointSummary.absent(),
        verify=CompletionReport.clean,
        step=_Step(),
        config=ScopedConfig(),
        settings=settings,
        now=NOW,
    )
    return decision.action


def test_bounds_are_the_documented_ones() -> None:
    assert MAX_SETTING_SECONDS == THIRTY_DAYS
    assert MAX_RECOVERY_ATTEMPTS == 1000
    assert MAX_OFFLINE_LATENCY_MS == 600_000
    assert ENV_NAMES["offline_latency_ms"] == "PIPELINE_OFFLINE_LATENCY_MS"


TOO_BIG = [
    pytest.param(
        "PIPELINE_RUNNING_TIMEOUT_SECONDS",
        "10000000000000000000000",
        "running_timeout_seconds",
        id="timeout-overflows-timedelta",
    ),
    pytest.param(
        "PIPELINE_RUNNING_TIMEOUT_SECONDS",
        str(THIRTY_DAYS + 1),
        "running_timeout_seconds",
        id="timeout-30-days-plus-1",
    ),
    pytest.param(
        "PIPELINE_RETRY_BACKOFF_SECONDS",
        "99999999999999999",
        "retry_backoff_seconds",
        id="backoff-overflows-datetime",
    ),
    pytest.param(
        "PIPELINE_RETRY_BACKOFF_SECONDS",
        str(THIRTY_DAYS + 1),
        "retry_backoff_seconds",
        id="backoff-30-days-plus-1",
    ),
    pytest.param(
        "PIPELINE_MAX_RECOVERY_ATTEMPTS",
        "99999999999999999999",
        "max_recovery_attempts",
        id="attempts-huge",
    ),
    pytest.param(
        "PIPELINE_MAX_RECOVERY_ATTEMPTS", "1001", "max_recovery_attempts", id="attempts-1001"
    ),
    pytest.param("PIPELINE_OFFLINE_LATENCY_MS", "abc", "offline_latency_ms", id="latency-nan"),
    pytest.param("PIPELINE_OFFLINE_LATENCY_MS", "-1", "offline_latency_ms", id="latency-neg"),
    pytest.param("PIPELINE_OFFLINE_LATENCY_MS", "2.5", "offline_latency_ms", id="latency-frac"),
    pytest.param(
        "PIPELINE_OFFLINE_LATENCY_MS", "600001", "offline_latency_ms", id="latency-10-min-plus-1"
    ),
]


@pytest.mark.parametrize(("var", "value", "setting"), TOO_BIG)
def test_out_of_range_env_refuses_at_validation_naming_the_variable(
    var: str, value: str, setting: str
) -> None:
    with pytest.raises(PipelineError) as info:
        ResumeSettings.from_env({var: value})
    error = info.value
    assert error.code == "settings.invalid"
    assert error.status == 400
    assert error.details == {"setting": setting}
    assert var in error.message
    assert setting in error.message
    assert repr(value) in error.message


@pytest.mark.parametrize(
    ("values", "var"),
    [
        ({"running_timeout_seconds": 10**22}, "PIPELINE_RUNNING_TIMEOUT_SECONDS"),
        ({"retry_backoff_seconds": 10**17}, "PIPELINE_RETRY_BACKOFF_SECONDS"),
        ({"max_recovery_attempts": 10**20}, "PIPELINE_MAX_RECOVERY_ATTEMPTS"),
        ({"offline_latency_ms": 10**9}, "PIPELINE_OFFLINE_LATENCY_MS"),
    ],
)
def test_out_of_range_overrides_refuse_too(values: dict[str, object], var: str) -> None:
    """Dagster resource config reaches the model through ``build``/overrides: same bounds."""
    with pytest.raises(PipelineError) as info:
        ResumeSettings.from_env({}, **values)
    assert info.value.code == "settings.invalid"
    assert var in info.value.message


def test_the_upper_bounds_themselves_are_accepted_and_usable() -> None:
    env = {
        "PIPELINE_RUNNING_TIMEOUT_SECONDS": str(THIRTY_DAYS),
        "PIPELINE_RETRY_BACKOFF_SECONDS": str(THIRTY_DAYS),
        "PIPELINE_MAX_RECOVERY_ATTEMPTS": "1000",
        "PIPELINE_OFFLINE_LATENCY_MS": "600000",
    }
    settings = ResumeSettings.from_env(env)
    assert settings.running_timeout_seconds == THIRTY_DAYS
    assert settings.retry_backoff_seconds == THIRTY_DAYS
    assert settings.max_recovery_attempts == 1000
    assert settings.offline_latency_ms == 600_000
    # The judge and the backoff arithmetic (attempts * backoff after now) cannot overflow.
    healthy = format_timestamp(NOW - timedelta(days=29))
    stale = format_timestamp(NOW - timedelta(days=30))
    assert _judge_running(settings, healthy) is ResumeAction.BLOCK
    assert _judge_running(settings, stale) is ResumeAction.STALE_RUNNING_RECOVERY
    worst_retry = NOW + timedelta(
        seconds=settings.max_recovery_attempts * settings.retry_backoff_seconds
    )
    assert worst_retry.year < 2200


def test_latency_defaults_to_zero_and_reads_the_env() -> None:
    assert ResumeSettings.from_env({}).offline_latency_ms == 0
    assert ResumeSettings.from_env({"PIPELINE_OFFLINE_LATENCY_MS": ""}).offline_latency_ms == 0
    assert ResumeSettings.from_env({"PIPELINE_OFFLINE_LATENCY_MS": "250"}).offline_latency_ms == 250


def test_offline_models_bound_an_explicit_latency_too() -> None:
    from pydantic import ValidationError

    from resources.providers import OfflineImageModel, OfflineTextModel

    for model in (OfflineTextModel, OfflineImageModel):
        assert model(latency_ms=MAX_OFFLINE_LATENCY_MS).latency_ms == MAX_OFFLINE_LATENCY_MS
        with pytest.raises(ValidationError):
            model(latency_ms=MAX_OFFLINE_LATENCY_MS + 1)
