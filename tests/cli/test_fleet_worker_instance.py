"""A fleet worker process opens the Dagster instance its step tasks carry once, and keeps a
database connection to it between queries: dagster-celery's step task opened the instance
again for every step (its storages checked their tables each time) and dagster-postgres
opened a connection per query (BENCHMARKS.md#the-fleet-steps-on-celery-workers)."""

import shutil
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from cli_helpers import ROOT
from dagster_dev import create_database, drop_database

from pipeline_defs.wiring.fleet_tasks import close_worker_instances, worker_instance


@pytest.fixture
def shared_ref(
    pg_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[object, str, str]]:
    """The reference of a PostgreSQL instance as the shipped dagster.yaml makes it."""
    name, url = create_database(pg_server_url, "fleet_worker_instance")
    dagster_url = sa.make_url(url).set(drivername="postgresql+psycopg2")
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_url.render_as_string(hide_password=False))
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    launcher = dg.DagsterInstance.from_config(str(home))
    try:
        yield launcher.get_ref(), url, name
    finally:
        close_worker_instances()
        launcher.dispose()
        drop_database(pg_server_url, name)


def _connections(url: str, name: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = %(name)s AND pid <> pg_backend_pid()",
                    {"name": name},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def test_a_worker_process_opens_the_instance_once_and_keeps_its_connection(
    shared_ref: tuple[object, str, str],
) -> None:
    ref, url, name = shared_ref
    first = worker_instance(ref)
    assert worker_instance(ref) is first  # the next task's: the same instance
    assert first.get_run_by_id("no-such-run") is None
    held = _connections(url, name)
    assert first.get_run_by_id("no-such-run") is None
    # the connection stays open between queries, and a second query opens no other
    assert held >= 1
    assert _connections(url, name) == held


def test_closing_the_kept_instances_opens_a_new_one_next_time(
    shared_ref: tuple[object, str, str],
) -> None:
    ref = shared_ref[0]
    first = worker_instance(ref)
    assert first.get_run_by_id("no-such-run") is None
    close_worker_instances()
    assert worker_instance(ref) is not first
