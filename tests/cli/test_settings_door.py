"""``storyboard settings`` refuses at the door what would be refused later.

Driven as an operator drives it: ``storyboard`` through click's runner with real
``PIPELINE_*`` variables and a real ledger (SQLite and PostgreSQL), and once through the
installed console script, where a shell hands ``-1`` over as one more word.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from cli_helpers import CliEnv, make_env

from pipeline_defs.resume.settings import ENV_NAMES, MAX_SETTING_SECONDS

STORYBOARD = Path(sys.executable).with_name("storyboard")


@pytest.fixture
def door_cli(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> CliEnv:
    for var in ENV_NAMES.values():
        monkeypatch.delenv(var, raising=False)
    env = make_env(tmp_path, db_url)
    env.ok("migrate")
    env.ok("settings", "set", "retry_backoff_seconds", "5")  # one value that must survive
    return env


def _stored(door_cli: CliEnv) -> dict[str, str]:
    return door_cli.ledger.stored_settings(max_age=0)


def _one_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, stderr
    return lines[0]


# ------------------------------------------------------------------ negative values (1)
@pytest.mark.parametrize(
    ("key", "value", "bound"),
    [
        ("lease_seconds", "-1", "greater than 0"),
        ("heartbeat_seconds", "-0.5", "greater than 0"),
        ("retry_backoff_seconds", "-30", "greater than or equal to 0"),
        ("max_recovery_attempts", "-3", "greater than or equal to 1"),
    ],
)
def test_a_negative_value_is_refused_by_its_bound_not_taken_for_an_option(
    door_cli: CliEnv, key: str, value: str, bound: str
) -> None:
    result = door_cli.invoke("settings", "set", key, value)
    assert result.exit_code == 1, result.output
    assert "No such option" not in result.output
    line = _one_error(result.stderr)
    assert line.startswith("error: [settings.invalid]"), line
    assert key in line and repr(value) in line and bound in line, line
    assert _stored(door_cli) == {"retry_backoff_seconds": "5"}


def test_a_negative_value_is_refused_in_json_too(door_cli: CliEnv) -> None:
    payload = door_cli.json("settings", "set", "lease_seconds", "-1")
    assert payload["ok"] is False
    assert payload["error"]["code"] == "settings.invalid"
    assert "lease_seconds" in payload["error"]["message"]
    assert "greater than 0" in payload["error"]["message"]


def test_the_console_script_takes_a_negative_value_as_the_value(door_cli: CliEnv) -> None:
    """What a shell runs: ``storyboard settings set lease_seconds -1``."""
    env = {**os.environ, **door_cli.env, "STORYBOARD_DEFS": "pipeline_defs.definitions:defs"}
    done = subprocess.run(
        [str(STORYBOARD), "settings", "set", "lease_seconds", "-1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert "No such option" not in done.stderr
    line = _one_error(done.stderr)
    assert "[settings.invalid]" in line and "lease_seconds" in line and "greater than 0" in line
    assert _stored(door_cli) == {"retry_backoff_seconds": "5"}


def test_a_valid_value_and_the_json_flag_still_work(door_cli: CliEnv) -> None:
    payload = door_cli.json("settings", "set", "lease_seconds", "90")
    assert payload["ok"] is True and payload["new"] == "90"
    assert _stored(door_cli) == {"retry_backoff_seconds": "5", "lease_seconds": "90"}


# ------------------------------------------------------------------ not a number (2)
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity"])
@pytest.mark.parametrize("key", ["lease_seconds", "heartbeat_seconds"])
def test_nan_and_inf_are_said_to_be_no_number(door_cli: CliEnv, key: str, value: str) -> None:
    result = door_cli.invoke("settings", "set", key, value)
    assert result.exit_code == 1, result.output
    line = _one_error(result.stderr)
    assert "[settings.invalid]" in line and key in line, line
    assert "not a number" in line, line
    # Not the misleading bound of before ("less than or equal to 2592000").
    assert str(MAX_SETTING_SECONDS) not in line, line
    assert _stored(door_cli) == {"retry_backoff_seconds": "5"}


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_nan_variable_is_said_to_be_no_number_at_start(door_cli: CliEnv, value: str) -> None:
    result = door_cli.invoke("status", env={"PIPELINE_LEASE_SECONDS": value})
    assert result.exit_code == 1
    line = _one_error(result.stderr)
    assert "PIPELINE_LEASE_SECONDS" in line and "not a number" in line, line


# ------------------------------------------------------------------ env vs ledger (6)
def test_an_env_heartbeat_that_breaks_the_ledger_lease_refuses_at_start(door_cli: CliEnv) -> None:
    """The ledger holds lease 30 s (fine with the default 10 s beat); this process's
    PIPELINE_HEARTBEAT_SECONDS=20 breaks the pair. Refused before any run is launched."""
    door_cli.ok("settings", "set", "lease_seconds", "30")
    door_cli.ok(
        "add-episode", "--project", "p", "--episode", "e1", "--story", str(door_cli.story("fox"))
    )
    result = door_cli.invoke(
        "materialize", "--partition", "p/e1", env={"PIPELINE_HEARTBEAT_SECONDS": "20"}
    )
    assert result.exit_code == 1, result.output
    line = _one_error(result.stderr)
    assert line.startswith("error: [settings.invalid]"), line
    assert "PIPELINE_HEARTBEAT_SECONDS='20'" in line, line
    assert "ledger setting lease_seconds='30'" in line, line
    assert "run " not in line, line  # not a launched run's failure
    instance = dg.DagsterInstance.from_config(str(door_cli.dagster_home))
    assert instance.get_runs() == []  # no run was launched
    assert door_cli.ledger.get_many() == {}  # nothing claimed


def test_the_ledger_half_can_still_be_repaired_from_that_environment(door_cli: CliEnv) -> None:
    door_cli.ok("settings", "set", "lease_seconds", "30")
    env = {"PIPELINE_HEARTBEAT_SECONDS": "20"}
    fixed = door_cli.invoke("settings", "set", "lease_seconds", "60", env=env)
    assert fixed.exit_code == 0, fixed.output
    assert _stored(door_cli)["lease_seconds"] == "60"
    shown = door_cli.invoke("settings", "show", "--json", env=env)
    assert shown.exit_code == 0, shown.output
    rows = {r["key"]: r for r in json.loads(shown.stdout)["settings"]}
    assert (rows["heartbeat_seconds"]["value"], rows["heartbeat_seconds"]["source"]) == (
        20,
        "env",
    )
    assert door_cli.invoke("status", env=env).exit_code == 0


def test_a_lease_variable_below_the_ledger_heartbeat_refuses_too(door_cli: CliEnv) -> None:
    door_cli.ok("settings", "set", "lease_seconds", "600")
    door_cli.ok("settings", "set", "heartbeat_seconds", "100")
    result = door_cli.invoke(
        "add-episode",
        "--project",
        "p",
        "--episode",
        "e1",
        "--story",
        str(door_cli.story("fox")),
        env={"PIPELINE_LEASE_SECONDS": "150"},
    )
    assert result.exit_code == 1, result.output
    line = _one_error(result.stderr)
    assert "PIPELINE_LEASE_SECONDS='150'" in line and "heartbeat_seconds='100'" in line, line
