"""The Dagster instance's PostgreSQL driver, checked when the code location, a
``storyboard worker`` or any ``storyboard`` command starts.

Dagster's docs name an instance's PostgreSQL database as ``postgres_url: postgresql://…`` or
as a ``postgres_db:`` block, whose ``scheme`` defaults to ``postgresql``. SQLAlchemy 2.1 opens
a URL of no driver with psycopg 3, and dagster-postgres's ``NOTIFY run_events, :id`` does not
survive psycopg 3's server-side parameters: the instance opens, and then the first event of
the first run fails (``ProgrammingError … NOTIFY run_events, $1``), far from its cause. The
driver dagster-postgres works with is psycopg2 (deploy/dagster.yaml: ``postgresql+psycopg2``).

The processes that are not ours (``dagster-webserver``, ``dagster-daemon``) open the same
instance with the same SQLAlchemy, so no setting of this process would fix it for them: the
instance's file is what must say ``psycopg2``. :func:`check_dagster_storage` reads
``$DAGSTER_HOME/dagster.yaml`` (its file only: no database is reached) and refuses, naming
the file, the setting, the cause and the fix, a storage of dagster-postgres that SQLAlchemy
would open with psycopg 3.
"""

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.engine import make_url

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.fleet_settings import masked

WORKING_DRIVER = "postgresql+psycopg2"
# The storages one at a time (the older form of dagster.yaml), beside ``storage: postgres:``.
SEPARATE_STORAGES = ("run_storage", "event_log_storage", "schedule_storage")
_DEFAULT_SCHEME = "postgresql"  # dagster-postgres's default for a postgres_db block


def check_dagster_storage(env: Mapping[str, str] | None = None) -> None:
    """Refuse a Dagster instance whose PostgreSQL storage SQLAlchemy opens with psycopg 3."""
    source = os.environ if env is None else env
    home = source.get("DAGSTER_HOME", "")
    if not home:
        return
    path = Path(home) / "dagster.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # none, or one Dagster refuses in its own words when it loads it
    if not isinstance(config, dict):
        return
    for where, postgres in _postgres_storages(config):
        problem = _psycopg3_form(where, postgres, source)
        if problem is not None:
            raise PipelineError(
                ErrorCode.CONFIG_DAGSTER_STORAGE,
                f"the Dagster instance {path} names its PostgreSQL storage as {problem}, "
                "which SQLAlchemy 2.1 opens with psycopg 3 (a URL of no driver gets it), on "
                "which dagster-postgres's event NOTIFY fails: every run would fail inside "
                "with ProgrammingError ... NOTIFY run_events, $1. dagster-postgres works "
                f"with psycopg2: {_fix(where, postgres, source)}, as deploy/dagster.yaml does",
                details={"dagster_yaml": str(path), "setting": where},
            )


def _postgres_storages(config: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each dagster-postgres storage configuration of a ``dagster.yaml``, with its place."""
    storage = config.get("storage")
    if isinstance(storage, dict) and isinstance(storage.get("postgres"), dict):
        yield "storage.postgres", storage["postgres"]
    for key in SEPARATE_STORAGES:
        entry = config.get(key)
        if (
            isinstance(entry, dict)
            and str(entry.get("module", "")).startswith("dagster_postgres")
            and isinstance(entry.get("config"), dict)
        ):
            yield f"{key}.config", entry["config"]


def _psycopg3_form(where: str, postgres: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """How ``postgres`` names a database SQLAlchemy opens with psycopg 3, or None."""
    if "postgres_url" in postgres:
        raw = postgres["postgres_url"]
        url = _value(raw, env)
        if url is None or _driver(url) != "psycopg":
            return None
        origin = f" (from ${raw['env']})" if isinstance(raw, dict) else ""
        return f"{where}.postgres_url {masked(url)}{origin}"
    block = postgres.get("postgres_db")
    if isinstance(block, dict):
        scheme = _value(block.get("scheme"), env) if "scheme" in block else _DEFAULT_SCHEME
        if scheme is None or _driver(f"{scheme}://user@host/db") != "psycopg":
            return None
        given = "its default" if "scheme" not in block else "as written"
        return f"{where}.postgres_db with scheme {scheme} ({given})"
    return None


def _fix(where: str, postgres: Mapping[str, Any], env: Mapping[str, str]) -> str:
    if "postgres_url" in postgres:
        raw = postgres["postgres_url"]
        target = f"${raw['env']}" if isinstance(raw, dict) else f"{where}.postgres_url"
        _scheme, _, rest = (_value(raw, env) or "").partition("://")
        return f"write {target} as {masked(f'{WORKING_DRIVER}://{rest}')}"
    return f"add `scheme: {WORKING_DRIVER}` to {where}.postgres_db"


def _value(raw: Any, env: Mapping[str, str]) -> str | None:
    """A config value as Dagster reads it (``{env: X}``: the variable here); None: unset."""
    if isinstance(raw, dict):
        value = env.get(str(raw.get("env", "")), "")
        return value or None
    return None if raw is None else str(raw)


def _driver(url: str) -> str | None:
    """The driver SQLAlchemy picks for ``url`` (None: no URL it can read)."""
    try:
        return str(make_url(url).get_dialect().driver)
    except Exception:  # sqlalchemy raises ArgumentError, NoSuchModuleError, ValueError
        return None
