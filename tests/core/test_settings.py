"""ResumeSettings: pinned defaults, PIPELINE_* overrides, and refusals that name the culprit."""

from pathlib import Path
from typing import TypedDict

import pytest

from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.settings import ENV_NAMES, ResumeSettings


def test_defaults_are_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = ResumeSettings.from_env({})
    assert settings.running_timeout_seconds == 3600
    assert settings.max_recovery_attempts == 3
    assert settings.retry_backoff_seconds == 30
    assert settings.home == Path(".pipeline")
    assert settings.db_url is None
    expected = (tmp_path / ".pipeline" / "ledger.sqlite3").resolve()
    assert settings.ledger_url == f"sqlite:///{expected}"
    # The constructor and build() agree with from_env on every default.
    assert ResumeSettings() == settings == ResumeSettings.build()


def test_from_env_reads_the_process_environment_at_call_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ENV_NAMES.values():
        monkeypatch.delenv(var, raising=False)
    assert ResumeSettings.from_env().running_timeout_seconds == 3600
    monkeypatch.setenv("PIPELINE_RUNNING_TIMEOUT_SECONDS", "120")
    monkeypatch.setenv("PIPELINE_HOME", str(tmp_path / "h"))
    settings = ResumeSettings.from_env()
    assert settings.running_timeout_seconds == 120
    assert settings.ledger_url == f"sqlite:///{(tmp_path / 'h' / 'ledger.sqlite3').resolve()}"


def test_every_env_var_overrides(tmp_path: Path) -> None:
    env = {
        "PIPELINE_HOME": str(tmp_path / "home"),
        "PIPELINE_DB_URL": "postgresql+psycopg://u@db:5432/ledger",
        "PIPELINE_RUNNING_TIMEOUT_SECONDS": "90",
        "PIPELINE_MAX_RECOVERY_ATTEMPTS": "7",
        "PIPELINE_RETRY_BACKOFF_SECONDS": "0",
    }
    settings = ResumeSettings.from_env(env)
    assert settings.home == tmp_path / "home"
    assert settings.db_url == "postgresql+psycopg://u@db:5432/ledger"
    assert settings.ledger_url == "postgresql+psycopg://u@db:5432/ledger"
    assert settings.running_timeout_seconds == 90
    assert settings.max_recovery_attempts == 7
    assert settings.retry_backoff_seconds == 0


def test_sqlite_url_in_env_is_used_verbatim(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'other.db'}"
    assert ResumeSettings.from_env({"PIPELINE_DB_URL": url}).ledger_url == url


def test_empty_env_values_fall_back_to_defaults() -> None:
    env = dict.fromkeys(ENV_NAMES.values(), "")
    settings = ResumeSettings.from_env(env)
    assert settings == ResumeSettings()


def test_overrides_beat_env() -> None:
    env = {"PIPELINE_RUNNING_TIMEOUT_SECONDS": "90"}
    settings = ResumeSettings.from_env(env, running_timeout_seconds=45, max_recovery_attempts=1)
    assert settings.running_timeout_seconds == 45
    assert settings.max_recovery_attempts == 1


def test_settings_are_frozen() -> None:
    settings = ResumeSettings()
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        settings.running_timeout_seconds = 1  # type: ignore[misc]


INVALID = [
    pytest.param(
        "PIPELINE_RUNNING_TIMEOUT_SECONDS", "0", "running_timeout_seconds", id="timeout-zero"
    ),
    pytest.param(
        "PIPELINE_RUNNING_TIMEOUT_SECONDS", "-5", "running_timeout_seconds", id="timeout-neg"
    ),
    pytest.param(
        "PIPELINE_RUNNING_TIMEOUT_SECONDS", "soon", "running_timeout_seconds", id="timeout-nan"
    ),
    pytest.param(
        "PIPELINE_RUNNING_TIMEOUT_SECONDS", "1.5", "running_timeout_seconds", id="timeout-frac"
    ),
    pytest.param(
        "PIPELINE_MAX_RECOVERY_ATTEMPTS", "0", "max_recovery_attempts", id="attempts-zero"
    ),
    pytest.param(
        "PIPELINE_MAX_RECOVERY_ATTEMPTS", "-1", "max_recovery_attempts", id="attempts-neg"
    ),
    pytest.param(
        "PIPELINE_MAX_RECOVERY_ATTEMPTS", "three", "max_recovery_attempts", id="attempts-nan"
    ),
    pytest.param("PIPELINE_RETRY_BACKOFF_SECONDS", "-1", "retry_backoff_seconds", id="backoff-neg"),
    pytest.param(
        "PIPELINE_RETRY_BACKOFF_SECONDS", "30s", "retry_backoff_seconds", id="backoff-nan"
    ),
    pytest.param("PIPELINE_DB_URL", "mysql://u@h/db", "db_url", id="db-mysql"),
    pytest.param("PIPELINE_DB_URL", "postgres://u@h/db", "db_url", id="db-postgres-alias"),
    pytest.param("PIPELINE_DB_URL", "sqlite+aiosqlite:///x.db", "db_url", id="db-async"),
    pytest.param("PIPELINE_DB_URL", "/var/lib/ledger.db", "db_url", id="db-no-scheme"),
]


@pytest.mark.parametrize(("var", "value", "setting"), INVALID)
def test_invalid_env_refuses_naming_setting_and_variable(
    var: str, value: str, setting: str
) -> None:
    assert ENV_NAMES[setting] == var
    with pytest.raises(PipelineError) as info:
        ResumeSettings.from_env({var: value})
    error = info.value
    assert error.code == "settings.invalid"
    assert error.status == 400
    assert error.details == {"setting": setting}
    assert setting in error.message
    assert var in error.message
    assert repr(value) in error.message


class _BuildValues(TypedDict, total=False):
    """The keyword values the refusals below hand to ``ResumeSettings.build``."""

    running_timeout_seconds: int
    max_recovery_attempts: int
    retry_backoff_seconds: int
    db_url: str


@pytest.mark.parametrize(
    ("values", "setting"),
    [
        ({"running_timeout_seconds": 0}, "running_timeout_seconds"),
        ({"running_timeout_seconds": -3600}, "running_timeout_seconds"),
        ({"max_recovery_attempts": 0}, "max_recovery_attempts"),
        ({"retry_backoff_seconds": -30}, "retry_backoff_seconds"),
        ({"db_url": "oracle://scott@tiger/db"}, "db_url"),
    ],
)
def test_invalid_build_values_refuse(values: _BuildValues, setting: str) -> None:
    with pytest.raises(PipelineError) as info:
        ResumeSettings.build(**values)
    assert info.value.code == "settings.invalid"
    assert setting in info.value.message
    assert ENV_NAMES[setting] in info.value.message


def test_unknown_setting_is_refused_by_name() -> None:
    with pytest.raises(PipelineError) as info:
        ResumeSettings.build(running_timeout=10)
    assert info.value.code == "settings.invalid"
    assert "running_timeout" in info.value.message


def test_boundaries_accepted() -> None:
    settings = ResumeSettings.from_env(
        {
            "PIPELINE_RUNNING_TIMEOUT_SECONDS": "1",
            "PIPELINE_MAX_RECOVERY_ATTEMPTS": "1",
            "PIPELINE_RETRY_BACKOFF_SECONDS": "0",
        }
    )
    assert (settings.running_timeout_seconds, settings.max_recovery_attempts) == (1, 1)
    assert settings.retry_backoff_seconds == 0
