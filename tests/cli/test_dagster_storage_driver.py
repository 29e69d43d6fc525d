"""Dagster's own ways of naming its PostgreSQL database, on a real instance and a real run.

Dagster's docs write the instance's storage as ``postgres_url: postgresql://…`` or as a
``postgres_db:`` block (whose ``scheme`` defaults to ``postgresql``). SQLAlchemy 2.1 opens a
bare ``postgresql://`` with psycopg 3, on which dagster-postgres's event ``NOTIFY`` fails:
the first run died inside with ``[internal] ProgrammingError … NOTIFY run_events, $1``. Now
the CLI, a worker and the code location refuse such an instance when they start, naming the
file, the setting, why and the fix (``postgresql+psycopg2``), the password masked; the fix
as named then runs.
"""

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from cli_helpers import CliEnv, make_env
from dagster_dev import create_database, drop_database

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.storyboard import sample_stories
from pipeline_defs.wiring.instance_storage import check_dagster_storage

pytestmark = pytest.mark.pg

STORYBOARD = str(Path(sys.executable).with_name("storyboard"))
PASSWORD = "s3cretpw"  # PostgreSQL trusts the test's connections: any password will do
CODE = "[config.dagster_storage]"


def _url_form(url: sa.URL) -> dict[str, Any]:
    """``postgres_url: postgresql://…``, as Dagster's docs write it."""
    bare = url.set(drivername="postgresql", password=PASSWORD)
    return {"postgres_url": bare.render_as_string(hide_password=False)}


def _db_block(url: sa.URL) -> dict[str, Any]:
    """The ``postgres_db:`` block, its scheme left at its default."""
    return {
        "postgres_db": {
            "username": url.username,
            "password": PASSWORD,
            "hostname": url.host,
            "port": url.port or 5432,
            "db_name": url.database,
        }
    }


def _psycopg2(url: sa.URL) -> dict[str, Any]:
    """The form deploy/dagster.yaml uses: the driver dagster-postgres works with."""
    good = url.set(drivername="postgresql+psycopg2", password=PASSWORD)
    return {"postgres_url": good.render_as_string(hide_password=False)}


FORMS: dict[str, Callable[[sa.URL], dict[str, Any]]] = {
    "postgres_url": _url_form,
    "postgres_db": _db_block,
}


@pytest.fixture
def dagster_db(pg_server_url: str) -> Iterator[sa.URL]:
    name, url = create_database(pg_server_url, "driver_dagster")
    try:
        yield sa.make_url(url)
    finally:
        drop_database(pg_server_url, name)


def _instance_config(cli: CliEnv, postgres: dict[str, Any]) -> None:
    config = {"storage": {"postgres": postgres}, "telemetry": {"enabled": False}}
    (cli.dagster_home / "dagster.yaml").write_text(yaml.safe_dump(config))


def _run(cli: CliEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        env={**cli.subprocess_env(), "STORYBOARD_DEFS": ""},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _refusal(done: subprocess.CompletedProcess[str], form: str) -> str:
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-3000:]
    assert CODE in said, said[-3000:]
    assert "[internal]" not in said, said[-3000:]
    assert PASSWORD not in said, said[-3000:]
    line = next(line for line in said.splitlines() if CODE in line)
    assert form in line and "dagster.yaml" in line, line
    assert "psycopg 3" in line and "NOTIFY" in line, line  # the root cause
    assert "postgresql+psycopg2" in line, line  # the fix
    return line


@pytest.mark.parametrize("form", sorted(FORMS))
def test_dagster_s_own_forms_are_refused_at_start_and_the_named_fix_runs(
    tmp_path: Path, dagster_db: sa.URL, form: str
) -> None:
    """Before: ``storyboard materialize`` launched the run, which failed inside with
    ``[internal] ProgrammingError … NOTIFY run_events, $1``."""
    cli = make_env(tmp_path)
    _instance_config(cli, _psycopg2(dagster_db))
    story = str(sample_stories()["ep01"])
    add = _run(cli, STORYBOARD, "add-episode", "--project", "p", "--episode", "e", "--story", story)
    assert add.returncode == 0, add.stderr[-3000:]

    _instance_config(cli, FORMS[form](dagster_db))
    # The CLI, before any run.
    done = _run(cli, STORYBOARD, "materialize", "--partition", "p/e", "--step", "story_source")
    line = _refusal(done, form)
    assert "scheme: postgresql+psycopg2" in line or "postgres_url" in line, line
    # A worker, before it serves anything.
    _refusal(_run(cli, STORYBOARD, "worker"), form)
    # The code location, as Dagster loads it.
    _refusal(_run(cli, sys.executable, "-c", "import pipeline_defs.definitions"), form)
    with dg.DagsterInstance.from_config(str(_psycopg2_home(cli, dagster_db))) as instance:
        assert instance.get_runs() == []
    assert cli.ledger.provider_calls() == []

    # The fix the refusal names: the run completes.
    _instance_config(cli, _psycopg2(dagster_db))
    done = _run(cli, STORYBOARD, "materialize", "--partition", "p/e", "--step", "story_source")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    with dg.DagsterInstance.from_config(str(cli.dagster_home)) as instance:
        runs = instance.get_runs()
        assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS]


def _psycopg2_home(cli: CliEnv, url: sa.URL) -> Path:
    """A DAGSTER_HOME of the test's own on the same database, in the working form."""
    home = cli.root / "reader_home"
    home.mkdir(exist_ok=True)
    config = {"storage": {"postgres": _psycopg2(url)}, "telemetry": {"enabled": False}}
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    return home


def test_the_shipped_form_passes_and_its_variable_is_named_when_it_lacks_the_driver(
    tmp_path: Path,
) -> None:
    """deploy/dagster.yaml with ``postgresql+psycopg2`` in DAGSTER_PG_URL (and an instance
    of no dagster.yaml) start as before; a DAGSTER_PG_URL of no driver is refused by name."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "dagster.yaml"
    (home / "dagster.yaml").write_text(shipped.read_text())
    env = {"DAGSTER_HOME": str(home), "DAGSTER_PG_URL": "postgresql+psycopg2://d@h:5432/d"}
    check_dagster_storage(env)
    check_dagster_storage({**env, "DAGSTER_HOME": str(tmp_path / "none")})
    check_dagster_storage({key: v for key, v in os.environ.items() if key != "DAGSTER_HOME"})
    bare = f"postgresql://d:{PASSWORD}@h:5432/d"
    with pytest.raises(PipelineError) as raised:
        check_dagster_storage({**env, "DAGSTER_PG_URL": bare})
    assert raised.value.code == ErrorCode.CONFIG_DAGSTER_STORAGE
    message = raised.value.message
    assert "$DAGSTER_PG_URL" in message and str(home / "dagster.yaml") in message, message
    assert "write $DAGSTER_PG_URL as postgresql+psycopg2://d:***@h:5432/d" in message, message
    assert PASSWORD not in message
