"""Helpers for CLI tests: an isolated environment, invoking ``storyboard``, snapshots."""

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from click.testing import CliRunner, Result

from pipeline_defs.cli import main
from resources.ledger.store import LedgerStore
from resources.ledger.tables import (
    episode_calls,
    provider_call,
    setting_change,
    settings,
    step_run,
    step_transition,
)

# The test-support modules (this directory): on PYTHONPATH for subprocesses and code
# locations started by tests, as pytest's ``pythonpath`` puts them for the tests.
TESTS_DIR = Path(__file__).resolve().parent
ROOT = TESTS_DIR.parents[1]  # the repository
FAKES = "storyboard_fakes:defs"
STORIES = {
    "fox": "The fox ran through the wood.\nThe crow sang on a branch.\nNight fell slowly.\n",
    "ship": "A ship sailed at dawn.\nA storm rose from the west.\n",
}

# The tables the zero-writes check must see at least (it reads every table there is).
LEDGER_TABLES = (step_run, step_transition, provider_call, episode_calls, settings, setting_change)


@dataclass
class CliEnv:
    """PIPELINE_HOME, DAGSTER_HOME and the ledger URL of one test."""

    root: Path
    home: Path
    dagster_home: Path
    db_url: str
    defs: str = FAKES

    @property
    def env(self) -> dict[str, str]:
        return {
            "PIPELINE_HOME": str(self.home),
            "DAGSTER_HOME": str(self.dagster_home),
            "PIPELINE_DB_URL": self.db_url,
            "STORYBOARD_DEFS": self.defs,
        }

    def invoke(self, *args: str, env: Mapping[str, str | None] | None = None) -> Result:
        """Run ``storyboard ARGS`` in-process with this environment."""
        runner = CliRunner()
        return runner.invoke(main, list(args), env={**self.env, **(env or {})})

    def ok(self, *args: str) -> Result:
        result = self.invoke(*args)
        assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
        return result

    def json(self, *args: str) -> dict[str, Any]:
        result = self.invoke(*args, "--json")
        payload: dict[str, Any] = json.loads(result.stdout)
        return payload

    @property
    def ledger(self) -> LedgerStore:
        return LedgerStore(self.db_url)

    def story(self, name: str) -> Path:
        path = self.root / "stories" / f"{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(STORIES[name], encoding="utf-8")
        return path

    def subprocess_env(self) -> dict[str, str]:
        """Environment for a real ``storyboard`` process (finds the fakes module)."""
        python_path = os.pathsep.join(
            p for p in (str(TESTS_DIR), os.environ.get("PYTHONPATH")) if p
        )
        return {**os.environ, **self.env, "PYTHONPATH": python_path}


def make_env(tmp_path: Path, db_url: str | None = None) -> CliEnv:
    home = tmp_path / "home"
    dagster_home = tmp_path / "dagster_home"
    home.mkdir()
    dagster_home.mkdir()
    url = db_url or f"sqlite:///{home / 'ledger.sqlite3'}"
    return CliEnv(tmp_path, home, dagster_home, url)


def ledger_dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table in the ledger database, in key order (the zero-writes check).

    The tables are read from the database itself, not from a list: a write to ``settings``,
    ``setting_change``, ``alembic_version`` or a table added later cannot slip past.
    """
    engine = sa.create_engine(url)
    try:
        return dump_tables(engine)
    finally:
        engine.dispose()


def dump_tables(engine: sa.Engine) -> dict[str, list[tuple[Any, ...]]]:
    """:func:`ledger_dump` on an open engine: table name → its rows, in key order."""
    found = sa.MetaData()
    found.reflect(bind=engine)
    assert {t.name for t in LEDGER_TABLES} <= set(found.tables) or not found.tables, (
        f"a migrated ledger lacks {sorted({t.name for t in LEDGER_TABLES} - set(found.tables))}"
    )
    with engine.connect() as conn:
        return {
            table.name: [
                tuple(r)
                for r in conn.execute(
                    sa.select(table).order_by(*(table.primary_key.columns or table.columns))
                )
            ]
            for table in found.sorted_tables
        }


def tree_snapshot(root: Path, *, exclude_prefix: str = "ledger.sqlite3") -> dict[str, Any]:
    """Every file and directory under ``root``: bytes hash, size and mtime (ns)."""
    snapshot: dict[str, Any] = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(exclude_prefix):
            continue
        stat = path.stat()
        if path.is_dir():
            snapshot[relative + "/"] = stat.st_mtime_ns
        else:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            snapshot[relative] = (digest, stat.st_size, stat.st_mtime_ns)
    return snapshot
