"""Alembic migrations: head matches the SQLAlchemy models on both databases, round-trips, and
survives two processes migrating a fresh PostgreSQL database at once."""

import multiprocessing
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from resources.ledger import tables
from resources.ledger.store import MIGRATIONS_DIR, LedgerStore, engine_for

LEDGER_TABLES = {
    "step_run",
    "step_transition",
    "provider_call",
    "episode_calls",
    "project_day_spend",
    "settings",
    "setting_change",
    "checkpoint_archive",
    "run_lease",
    "rate_limit",
    "rate_wait",
}
# Tables later migrations add (a downgrade to an earlier revision drops them too).
ADDED_AFTER_0009 = {"project_day_spend", "rate_limit", "rate_wait"}


def _config(conn: sa.Connection | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if conn is not None:
        cfg.attributes["connection"] = conn
    return cfg


def _head() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def _run(engine: sa.Engine, fn: Any, target: str) -> None:
    with engine.begin() as conn:
        fn(_config(conn), target)


def _current(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _diff(engine: sa.Engine) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": True}
        )
        diffs: list[Any] = compare_metadata(context, tables.metadata)
        return diffs


def _user_tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}


def test_script_directory_has_one_linear_head() -> None:
    script = ScriptDirectory.from_config(_config())
    assert len(script.get_heads()) == 1
    revisions = list(script.walk_revisions())
    assert revisions[-1].down_revision is None


def test_head_matches_models(db_url: str) -> None:
    engine = engine_for(db_url)
    assert _current(engine) is None
    _run(engine, command.upgrade, "head")
    assert _current(engine) == _head()
    assert _user_tables(engine) == LEDGER_TABLES
    assert _diff(engine) == []


def test_comparison_is_not_blind(db_url: str) -> None:
    """The comparison used above does see a real difference (so an empty diff means something)."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "head")
    drift = sa.MetaData(naming_convention=tables.metadata.naming_convention)
    for table in tables.metadata.sorted_tables:
        table.to_metadata(drift)
    run = drift.tables["step_run"]
    run.append_column(sa.Column("surprise", sa.Text))
    step = drift.tables["step_transition"]
    sa.Index("ix_step_transition_at", step.c.at)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, drift)
    kinds = sorted(d[0] if isinstance(d, tuple) else d[0][0] for d in diff)
    assert kinds == ["add_column", "add_index"]

    # A type change is reported too: step_run.input_hash as String(32) instead of String(64).
    typed = sa.MetaData(naming_convention=tables.metadata.naming_convention)
    for table in tables.metadata.sorted_tables:
        table.to_metadata(typed)
    typed.tables["step_run"].c.input_hash.type = sa.String(32)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, typed)
    assert [d[0][0] for d in diff] == ["modify_type"]
    assert diff[0][0][3] == "input_hash"


def test_schema_details_survive_migration(db_url: str) -> None:
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "head")
    inspector = sa.inspect(engine)
    columns = {c["name"]: c for c in inspector.get_columns("step_run")}
    for name in ("id", "project_id", "episode_id", "step_id", "status", "created_at", "updated_at"):
        assert columns[name]["nullable"] is False, name
    assert columns["recovery_count"]["nullable"] is False
    assert "0" in str(columns["recovery_count"]["default"])
    for name in ("started_at", "completed_at", "created_at", "updated_at", "heartbeat_at"):
        assert isinstance(columns[name]["type"], sa.Text), name  # text timestamps, never cast
    uniques = inspector.get_unique_constraints("step_run")
    assert [u["column_names"] for u in uniques] == [["project_id", "episode_id", "step_id"]]
    assert inspector.get_pk_constraint("step_run")["constrained_columns"] == ["id"]


def test_downgrade_base_then_upgrade_head_round_trip(db_url: str) -> None:
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "head")
    with engine.begin() as conn:
        conn.execute(
            sa.insert(tables.step_run).values(
                id="x",
                project_id="p",
                episode_id="e",
                step_id="s",
                status="pending",
                created_at="t",
                updated_at="t",
            )
        )
    _run(engine, command.downgrade, "base")
    assert _current(engine) is None
    assert _user_tables(engine) == set()
    _run(engine, command.upgrade, "head")
    assert _current(engine) == _head()
    assert _diff(engine) == []
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(tables.step_run)).scalar() == 0
    # And once more, to prove downgrade works on a DB that was itself re-created.
    _run(engine, command.downgrade, "base")
    _run(engine, command.upgrade, "head")
    assert _diff(engine) == []


def test_a_ledger_from_before_seals_is_upgraded_in_place(db_url: str) -> None:
    """0001 → head keeps every row; old rows simply have no seal (judged the long way)."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "0001_initial")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO step_run (id, project_id, episode_id, step_id, status, run_id, "
            "created_at, updated_at) VALUES ('x', 'p', 'e', 's', 'completed', 'r:0', 't', 't')"
        )
    store = LedgerStore(db_url)
    row = store.get(StepKey("p", "e", "s"))  # first use migrates to head
    assert _current(engine) == _head() and _diff(engine) == []
    assert row is not None and row.status == "completed" and row.checkpoint_seal is None
    _run(engine, command.downgrade, "0001_initial")  # and back, the row kept
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT status FROM step_run").all() == [("completed",)]


def test_a_ledger_from_before_settings_reads_as_holding_none(db_url: str) -> None:
    """At 0003 the judge's limits come from env and defaults (no error, no schema written);
    0004 adds the settings table and its audit, and the way back drops both."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "0003_provider_call_finished")
    store = LedgerStore(db_url)
    assert store.stored_settings(max_age=0) == {}
    assert _current(engine) == "0003_provider_call_finished"  # the read did not migrate
    assert "0004_settings" in {
        r.revision for r in ScriptDirectory.from_config(_config()).walk_revisions()
    }
    store.migrate()
    assert store.set_setting("lease_seconds", "120", changed_by="test") == (None, "120")
    assert store.stored_settings(max_age=0) == {"lease_seconds": "120"}
    _run(engine, command.downgrade, "0003_provider_call_finished")
    assert {"settings", "setting_change"}.isdisjoint(_user_tables(engine))


def _check_names(engine: sa.Engine, table: str) -> dict[str | None, str]:
    return {c["name"]: c["sqltext"] for c in sa.inspect(engine).get_check_constraints(table)}


def _model_check_names(table: str) -> set[str]:
    return {
        str(c.name)
        for c in tables.metadata.tables[table].constraints
        if isinstance(c, sa.CheckConstraint)
    }


def test_status_columns_refuse_a_status_that_is_not_a_step_status(db_url: str) -> None:
    """0005: the CHECKs in the migrated database are the ones tables.py declares (alembic's
    comparison does not look at CHECKs), and they refuse a bogus status, allow every
    StepStatus and a NULL audit status."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "head")
    for table in ("step_run", "step_transition"):
        found = _check_names(engine, table)
        assert set(found) == _model_check_names(table) != set(), table
        for text in found.values():
            assert all(f"'{s.value}'" in text for s in StepStatus), text
    row = {"project_id": "p", "episode_id": "e", "created_at": "t", "updated_at": "t"}
    audit = {"project_id": "p", "episode_id": "e", "step_id": "s", "action": "a", "at": "t"}
    with engine.begin() as conn:
        for n, status in enumerate(StepStatus):
            conn.execute(
                sa.insert(tables.step_run).values(
                    id=f"r{n}", step_id=f"s{n}", status=status.value, **row
                )
            )
            conn.execute(
                sa.insert(tables.step_transition).values(
                    from_status=status.value, to_status=None, **audit
                )
            )
    bogus = [
        sa.insert(tables.step_run).values(id="x", step_id="x", status="COMPLETED", **row),
        sa.insert(tables.step_transition).values(from_status="bogus", **audit),
        sa.insert(tables.step_transition).values(to_status="done", **audit),
    ]
    for statement in bogus:
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(statement)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(
            sa.update(tables.step_run).where(tables.step_run.c.id == "r0").values(status="done")
        )
    with engine.connect() as conn:
        count = sa.select(sa.func.count()).select_from(tables.step_run)
        assert conn.execute(count).scalar() == len(StepStatus)


def test_status_check_migration_keeps_rows_and_drops_cleanly(db_url: str) -> None:
    """0004 → 0005 copies step_run (SQLite batch mode) with its rows; the way back drops
    the CHECKs and a bogus status is accepted again."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "0004_settings")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO step_run (id, project_id, episode_id, step_id, status, run_id, "
            "created_at, updated_at) VALUES ('x', 'p', 'e', 's', 'running', 'r:0', 't', 't')"
        )
    _run(engine, command.upgrade, "0005_status_check")
    assert set(_check_names(engine, "step_run")) == {"ck_step_run_status"}
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT id, status FROM step_run").all() == [("x", "running")]
    _run(engine, command.downgrade, "0004_settings")
    assert _check_names(engine, "step_run") == {} and _check_names(engine, "step_transition") == {}
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE step_run SET status = 'bogus'")


def test_pointer_migration_keeps_rows_and_drops_cleanly(db_url: str) -> None:
    """0005 → 0006 adds the commit pointer (NULL for existing rows: a local home publishes
    files) and the archive of pointers; the way back removes both and keeps the rows."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "0005_status_check")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO step_run (id, project_id, episode_id, step_id, status, run_id, "
            "created_at, updated_at) VALUES ('x', 'p', 'e', 's', 'completed', 'r:0', 't', 't')"
        )
    _run(engine, command.upgrade, "0006_checkpoint_pointer")
    assert "checkpoint_archive" in _user_tables(engine)
    columns = {c["name"] for c in sa.inspect(engine).get_columns("step_run")}
    assert "checkpoint_pointer" in columns
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT id, checkpoint_pointer FROM step_run").all()
    assert rows == [("x", None)]
    _run(engine, command.downgrade, "0005_status_check")
    assert "checkpoint_archive" not in _user_tables(engine)
    columns = {c["name"] for c in sa.inspect(engine).get_columns("step_run")}
    assert "checkpoint_pointer" not in columns
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT id FROM step_run").all() == [("x",)]


def test_worker_migration_keeps_history_and_drops_cleanly(db_url: str) -> None:
    """0006 → 0007 adds who wrote each history line (NULL for lines written before); the way
    back removes the column and keeps the lines."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "0006_checkpoint_pointer")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO step_transition (project_id, episode_id, step_id, action, at) "
            "VALUES ('p', 'e', 's', 'skip', 't')"
        )
    _run(engine, command.upgrade, "0007_transition_worker")
    with engine.connect() as conn:
        columns = {c["name"] for c in sa.inspect(conn).get_columns("step_transition")}
        assert "worker" in columns
        rows = conn.exec_driver_sql("SELECT action, worker FROM step_transition").all()
    assert rows == [("skip", None)]
    _run(engine, command.downgrade, "0006_checkpoint_pointer")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("step_transition")}
    assert "worker" not in columns
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT action FROM step_transition").all() == [("skip",)]


def test_store_migrate_is_idempotent_and_usable(db_url: str) -> None:
    store = LedgerStore(db_url)
    assert store.migrate() == _head()
    assert LedgerStore(db_url).migrate() == _head()
    assert _diff(engine_for(db_url)) == []
    with engine_for(db_url).connect() as conn:
        versions = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
    assert versions == [(_head(),)]


def _migrate_child(url: str, barrier: Any, results: Any) -> None:
    try:
        barrier.wait(timeout=60)
        revision = LedgerStore(url).migrate()
        results.put(("ok", revision))
    except BaseException:  # report everything to the parent
        results.put(("error", traceback.format_exc()))


class SqliteWalRace(AssertionError):
    """A child failed with SQLite's "database is locked" (the known journal_mode race)."""


@pytest.mark.pg
@pytest.mark.parametrize("attempt", range(3))
def test_concurrent_migrate_on_fresh_postgres(pg_url: str, attempt: int) -> None:
    _concurrent_migrate(pg_url, processes=2)


@pytest.mark.parametrize("attempt", range(5))
def test_concurrent_migrate_on_fresh_sqlite(tmp_path: Path, attempt: int) -> None:
    _concurrent_migrate(f"sqlite:///{tmp_path / 'ledger.sqlite3'}", processes=2)


def _is_wal_race(text: str) -> bool:
    return "database is locked" in text and 'execute("PRAGMA journal_mode=WAL")' in text


def _concurrent_migrate(url: str, processes: int) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_migrate_child, args=(url, barrier, results)) for _ in range(processes)
    ]
    for proc in procs:
        proc.start()
    try:
        outcomes = [results.get(timeout=120) for _ in procs]
    finally:
        deadline = time.monotonic() + 30
        for proc in procs:
            proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
    errors = [text for status, text in outcomes if status == "error"]
    if url.startswith("sqlite") and errors and all(_is_wal_race(e) for e in errors):
        raise SqliteWalRace(errors)
    assert outcomes == [("ok", _head())] * processes
    engine = engine_for(url)
    assert _current(engine) == _head()
    assert _diff(engine) == []


def test_sqlite_migration_creates_the_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'nested.sqlite3'}"
    LedgerStore(url).migrate()
    assert (tmp_path / "nested.sqlite3").exists()


def test_episode_calls_migration_counts_the_calls_already_recorded(db_url: str) -> None:
    """0007 → 0008 adds the spend cap's counter (docs/DESIGN.md#spend-cap), filled from the
    provider calls recorded before it; the way back drops it and keeps the calls."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "0007_transition_worker")
    with engine.begin() as conn:
        for episode, step in (("e1", "a"), ("e1", "b"), ("e2", "a")):
            conn.exec_driver_sql(
                "INSERT INTO provider_call (project_id, episode_id, step_id, kind, units, at) "
                f"VALUES ('p', '{episode}', '{step}', 'text', 1, 't')"
            )
    _run(engine, command.upgrade, "0008_episode_calls")
    _run(engine, command.upgrade, "head")  # the later migrations add only tables of their own
    assert _diff(engine) == []
    with engine.connect() as conn:
        counts = conn.exec_driver_sql(
            "SELECT project_id, episode_id, calls FROM episode_calls ORDER BY episode_id"
        ).all()
    assert counts == [("p", "e1", 2), ("p", "e2", 1)]
    _run(engine, command.downgrade, "0007_transition_worker")
    assert "episode_calls" not in sa.inspect(engine).get_table_names()
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM provider_call").scalar() == 3


def test_the_money_migration_counts_the_calls_already_recorded_per_project_day(
    db_url: str,
) -> None:
    """0012 → 0013 adds the projects' rows per day (docs/DESIGN.md#money-budgets), counting
    the calls recorded before it (none had a price: no money)."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "0012_rate_limit")
    with engine.begin() as conn:
        for project, at in (
            ("p", "2026-01-01T10:00"),
            ("p", "2026-01-01T11:00"),
            ("p", "2026-01-02T09:00"),
            ("q", "2026-01-02T09:00"),
        ):
            conn.exec_driver_sql(
                "INSERT INTO provider_call (project_id, episode_id, step_id, kind, units, at) "
                f"VALUES ('{project}', 'e1', 'a', 'text', 1, '{at}')"
            )
    _run(engine, command.upgrade, "0013_money")
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT project_id, day, calls, priced, cost_micros FROM project_day_spend "
            "ORDER BY project_id, day"
        ).all()
    assert [tuple(r) for r in rows] == [
        ("p", "2026-01-01", 2, 0, 0),
        ("p", "2026-01-02", 1, 0, 0),
        ("q", "2026-01-02", 1, 0, 0),
    ]


def test_the_run_lease_migration_adds_its_table_and_takes_it_back(db_url: str) -> None:
    """0008 → 0009 adds ``run_lease`` (docs/DESIGN.md#run-leases): each run's coordinator
    lease; the way back drops it and nothing else."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "0008_episode_calls")
    assert "run_lease" not in sa.inspect(engine).get_table_names()
    _run(engine, command.upgrade, "0009_run_lease")
    assert "run_lease" in sa.inspect(engine).get_table_names()
    _run(engine, command.upgrade, "head")
    assert _diff(engine) == []
    _run(engine, command.downgrade, "0008_episode_calls")
    assert _user_tables(engine) == LEDGER_TABLES - {"run_lease"} - ADDED_AFTER_0009


def _step_run_columns(engine: sa.Engine) -> set[str]:
    return {column["name"] for column in sa.inspect(engine).get_columns("step_run")}


def test_the_journal_lineage_migration_adds_its_column_and_takes_it_back(db_url: str) -> None:
    """0009 → 0010 adds ``step_run.journal_lineage`` (docs/DESIGN.md#reply-journal), NULL on
    the rows there are (a lineage comes with their next claim); the way back drops it and
    keeps the rows."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "0009_run_lease")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO step_run (id, project_id, episode_id, step_id, status, created_at,"
            " updated_at, recovery_count) VALUES ('r1', 'p', 'e', 's', 'failed', 't', 't', 0)"
        )
    _run(engine, command.upgrade, "0010_journal_lineage")
    assert "journal_lineage" in _step_run_columns(engine)
    _run(engine, command.upgrade, "head")
    assert _diff(engine) == []
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT journal_lineage FROM step_run").all() == [(None,)]
    _run(engine, command.downgrade, "0009_run_lease")
    assert "journal_lineage" not in _step_run_columns(engine)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT id, status FROM step_run").all() == [("r1", "failed")]


def test_the_episode_estimate_migration_adds_its_column_and_takes_it_back(db_url: str) -> None:
    """0010 → 0011 adds ``episode_calls.estimated`` (NULL for the episodes there are); the
    way back drops it and keeps the counts."""
    engine = engine_for(db_url)
    _run(engine, command.upgrade, "0010_journal_lineage")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO episode_calls (project_id, episode_id, calls) VALUES ('p', 'e', 3)"
        )
    _run(engine, command.upgrade, "0011_episode_estimate")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT calls, estimated FROM episode_calls").all() == [
            (3, None)
        ]
    _run(engine, command.upgrade, "head")  # the later migrations keep what it added
    assert _diff(engine) == []
    _run(engine, command.downgrade, "0010_journal_lineage")
    columns = {column["name"] for column in sa.inspect(engine).get_columns("episode_calls")}
    assert "estimated" not in columns
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT calls FROM episode_calls").all() == [(3,)]
