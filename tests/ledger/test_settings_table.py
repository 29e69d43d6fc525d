"""one source of the judge's limits, the ledger's ``settings`` table.

The sensor daemon and every run worker read the same table, so they judge with the same
lease, timeout and retry limits. Precedence: a ``PIPELINE_*`` variable (per-process
override), then the table, then the default. Real SQLite and PostgreSQL, real Dagster.
"""

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from cli_helpers import CliEnv, make_env
from sensor_steps import SENSOR_STEPS, seed

from pipeline_defs.definitions import build_resources
from pipeline_defs.judging.registry import forget_tickers
from pipeline_defs.judging.stores import Stores
from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import (
    ENV_NAMES,
    LEDGER_KEYS,
    ResumeSettings,
    check_environment,
    resolve_settings,
)
from pipeline_defs.wiring.assets import build_step_assets
from resources.ledger.store import LedgerStore
from resources.pipeline import PipelineResource
from sensors.resume_sensor import build_resume_sensor

ROOT = Path(__file__).resolve().parents[2]


def _stored(cli_db: CliEnv) -> dict[str, str]:
    return cli_db.ledger.stored_settings(max_age=0)


# ---------------------------------------------------------------------------- seeding
def test_migrate_seeds_from_the_environment_and_never_overwrites(cli_db: CliEnv) -> None:
    seeded = cli_db.invoke("migrate", env={"PIPELINE_LEASE_SECONDS": "90"})
    assert seeded.exit_code == 0, seeded.output
    assert _stored(cli_db) == {"lease_seconds": "90"}
    (change,) = cli_db.ledger.setting_changes()
    assert (change["key"], change["old_value"], change["new_value"]) == (
        "lease_seconds",
        None,
        "90",
    )
    assert "PIPELINE_LEASE_SECONDS" in change["changed_by"]

    cli_db.ok("settings", "set", "lease_seconds", "120")
    again = cli_db.invoke(
        "migrate", env={"PIPELINE_LEASE_SECONDS": "90", "PIPELINE_MAX_RECOVERY_ATTEMPTS": "5"}
    )
    assert again.exit_code == 0, again.output
    # The operator's value stands; an absent key is still seeded.
    assert _stored(cli_db) == {"lease_seconds": "120", "max_recovery_attempts": "5"}
    changes = [(c["key"], c["old_value"], c["new_value"]) for c in cli_db.ledger.setting_changes()]
    assert changes == [
        ("lease_seconds", None, "90"),
        ("lease_seconds", "90", "120"),
        ("max_recovery_attempts", None, "5"),
    ]


# ---------------------------------------------------------------------------- set
def test_set_is_validated_audited_and_shown(cli_db: CliEnv) -> None:
    cli_db.ok("migrate")
    cli_db.ok("settings", "set", "running_timeout_seconds", "900")
    payload = cli_db.json("settings", "set", "lease_seconds", "300")
    assert payload["ok"] and payload["old"] is None and payload["new"] == "300"
    assert _stored(cli_db) == {"running_timeout_seconds": "900", "lease_seconds": "300"}
    (first, second) = cli_db.ledger.setting_changes()
    assert first["key"] == "running_timeout_seconds" and first["changed_by"]
    assert second["new_value"] == "300"

    shown = {s["key"]: s for s in cli_db.json("settings", "show")["settings"]}
    assert set(shown) == set(LEDGER_KEYS)
    assert shown["lease_seconds"]["value"] == 300 and shown["lease_seconds"]["source"] == "ledger"
    assert shown["heartbeat_seconds"]["source"] == "default"
    text = cli_db.ok("settings", "show").output
    assert "lease_seconds" in text and "ledger" in text


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lease_seconds", "0"),
        ("lease_seconds", "soon"),
        ("running_timeout_seconds", str(30 * 24 * 3600 + 1)),
        ("max_recovery_attempts", "0"),
        ("heartbeat_seconds", "40"),  # twice 40 is more than the default lease (60)
        ("max_calls_per_episode", ""),  # was written as the default (200)
        ("lease_seconds", "   "),
    ],
)
def test_a_bad_value_is_refused_naming_the_key_and_nothing_is_written(
    cli_db: CliEnv, key: str, value: str
) -> None:
    cli_db.ok("migrate")
    cli_db.ok("settings", "set", "retry_backoff_seconds", "5")
    payload = cli_db.json("settings", "set", key, value)
    assert payload["ok"] is False
    assert payload["error"]["code"] == "settings.invalid"
    assert key in payload["error"]["message"] or "lease_seconds" in payload["error"]["message"]
    assert _stored(cli_db) == {"retry_backoff_seconds": "5"}
    assert len(cli_db.ledger.setting_changes()) == 1


@pytest.mark.parametrize("key", ["home", "db_url", "offline_latency_ms", "nope"])
def test_only_the_judge_limits_live_in_the_table(cli_db: CliEnv, key: str) -> None:
    cli_db.ok("migrate")
    payload = cli_db.json("settings", "set", key, "1")
    assert payload["error"]["code"] == "settings.invalid"
    assert repr(key) in payload["error"]["message"]
    assert _stored(cli_db) == {}


def test_set_refuses_an_unmigrated_ledger_without_creating_it(tmp_path: Path) -> None:
    cli_db = make_env(tmp_path)
    payload = cli_db.json("settings", "set", "lease_seconds", "300")
    assert payload["error"]["code"] == "ledger.not_migrated"
    assert not (cli_db.home / "ledger.sqlite3").exists()


# ---------------------------------------------------------------------------- precedence
def test_precedence_is_env_then_table_then_default() -> None:
    env = {"PIPELINE_LEASE_SECONDS": "100"}
    ledger = {"lease_seconds": "300", "running_timeout_seconds": "900"}
    effective = resolve_settings(env, ledger=ledger)
    assert effective.settings.lease_seconds == 100
    assert effective.settings.running_timeout_seconds == 900
    assert effective.settings.max_recovery_attempts == 3
    assert effective.sources["lease_seconds"] == "env"
    assert effective.sources["running_timeout_seconds"] == "ledger"
    assert effective.sources["max_recovery_attempts"] == "default"
    # A value the code location's resource sets is code, above the environment.
    assert resolve_settings(env, ledger=ledger, lease_seconds=200).sources["lease_seconds"] == (
        "resource"
    )


def test_a_bad_table_value_names_the_ledger_setting() -> None:
    with pytest.raises(PipelineError) as info:
        resolve_settings({}, ledger={"lease_seconds": "-1"})
    assert info.value.code == "settings.invalid"
    assert "ledger setting lease_seconds" in info.value.message


def test_the_resource_reads_the_table_with_env_precedence(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ENV_NAMES.values():
        monkeypatch.delenv(var, raising=False)
    store = LedgerStore(db_url)
    store.migrate()
    pipeline = PipelineResource(home=str(tmp_path), db_url=db_url)
    assert pipeline.settings().lease_seconds == 60
    pipeline.ledger().set_setting("lease_seconds", "600", changed_by="test")
    # ``set_setting`` on this process's store drops its cache: no TTL wait here.
    assert pipeline.settings().lease_seconds == 600
    assert pipeline.effective_settings().sources["lease_seconds"] == "ledger"
    monkeypatch.setenv("PIPELINE_LEASE_SECONDS", "120")
    assert pipeline.settings().lease_seconds == 120
    assert pipeline.effective_settings().sources["lease_seconds"] == "env"


def test_status_prints_what_is_in_force_and_where_it_came_from(cli_db: CliEnv) -> None:
    cli_db.ok("migrate")
    cli_db.ok("settings", "set", "lease_seconds", "300")
    payload = cli_db.invoke("status", "--json", env={"PIPELINE_MAX_RECOVERY_ATTEMPTS": "7"})
    assert payload.exit_code == 0, payload.output
    import json

    settings = {s["key"]: s for s in json.loads(payload.stdout)["settings"]}
    assert (settings["lease_seconds"]["value"], settings["lease_seconds"]["source"]) == (
        300,
        "ledger",
    )
    assert settings["max_recovery_attempts"]["source"] == "env"
    assert settings["heartbeat_seconds"]["source"] == "default"
    text = cli_db.invoke("status", env={"PIPELINE_MAX_RECOVERY_ATTEMPTS": "7"}).output
    assert "lease_seconds=300 (ledger)" in text
    assert "max_recovery_attempts=7 (env)" in text


# ---------------------------------------------------------------------------- the judges
def test_the_sensor_and_a_run_worker_judge_with_the_table_lease(
    db_url: str, tmp_path: Path, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat 120 s old: stale under the default lease (60 s), live under 600 s."""
    for var in ENV_NAMES.values():
        monkeypatch.delenv(var, raising=False)
    forget_tickers()
    LedgerStore(db_url).migrate()
    pipeline = PipelineResource(home=str(tmp_path / "home"), db_url=db_url)
    stores = Stores.of(pipeline)
    seed(stores, "p/e1")
    instance.add_dynamic_partitions("episodes", ["p/e1"])
    now = datetime.now(UTC)
    key = StepKey("p", "e1", "mid")
    assert stores.ledger.claim(key, "w:0", now=format_timestamp(now - timedelta(seconds=120)))
    sensor = build_resume_sensor(SENSOR_STEPS, clock=lambda: now)
    defs = dg.Definitions(
        assets=build_step_assets(SENSOR_STEPS),
        sensors=[sensor],
        resources=build_resources(pipeline),
    )

    def launches() -> set[str]:
        context = dg.build_sensor_context(
            instance=instance, definitions=defs, resources={"pipeline": pipeline}
        )
        with dg.partition_loading_context(dynamic_partitions_store=instance):
            result = sensor.evaluate_tick(context)
        return {r.tags["resume/action"] for r in result.run_requests or []}

    assert launches() == {"stale_running_recovery"}
    pipeline.ledger().set_setting("lease_seconds", "600", changed_by="test")
    forget_tickers()
    assert launches() == set()
    # A run worker builds its settings the same way (``assets.py``: pipeline.settings()).
    assert pipeline.settings().lease_seconds == 600
    forget_tickers()


# ---------------------------------------------------------------------------- refusal at start
def test_check_environment_names_the_variable() -> None:
    with pytest.raises(PipelineError) as info:
        check_environment({"PIPELINE_LEASE_SECONDS": "-5"})
    assert "PIPELINE_LEASE_SECONDS" in info.value.message
    # One of a pair alone is not judged against a default the table may replace.
    check_environment({"PIPELINE_HEARTBEAT_SECONDS": "40"})
    with pytest.raises(PipelineError, match="lease_seconds"):
        check_environment({"PIPELINE_HEARTBEAT_SECONDS": "40", "PIPELINE_LEASE_SECONDS": "60"})
    assert ResumeSettings.from_env({}).lease_seconds == 60


def test_the_code_location_refuses_to_load_on_a_bad_variable(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "DAGSTER_HOME": str(tmp_path),
        "PIPELINE_RUNNING_TIMEOUT_SECONDS": "soon",
    }
    result = subprocess.run(
        [sys.executable, "-c", "import pipeline_defs; pipeline_defs.defs"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0
    assert "PIPELINE_RUNNING_TIMEOUT_SECONDS" in result.stderr
    assert "settings.invalid" in result.stderr


def test_the_cli_refuses_to_start_on_a_bad_variable(cli_db: CliEnv) -> None:
    result = cli_db.invoke("decide", env={"PIPELINE_MAX_RECOVERY_ATTEMPTS": "three"})
    assert result.exit_code == 1
    assert "PIPELINE_MAX_RECOVERY_ATTEMPTS" in result.output
    assert not (cli_db.home / "ledger.sqlite3").exists()


def test_settings_read_while_another_process_migrates_the_new_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Processes started at once on a new SQLite ledger: one reads the settings while
    another migrates it. Its read found no table; by the time it looked, the table was
    there, and it failed ``no such table: settings`` (seen in CI: three ``materialize`` at
    once). The read is taken again instead."""
    from resources.ledger.settings_cache import SettingsCache

    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    (tmp_path / "ledger.sqlite3").touch()  # created by the other process's first connect
    reader = LedgerStore(url)
    select = SettingsCache._select_settings
    reads: list[str] = []

    def the_other_process_migrates_in_between(cache: SettingsCache) -> dict[str, str]:
        reads.append("read")
        if len(reads) == 1:
            try:
                return select(cache)  # the real read of the empty file: no such table
            finally:
                LedgerStore(url).migrate()  # ... and then the other process commits
        return select(cache)

    monkeypatch.setattr(SettingsCache, "_select_settings", the_other_process_migrates_in_between)
    assert reader.stored_settings(max_age=0) == {}
    assert reads == ["read", "read"]
