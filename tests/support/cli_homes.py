"""Homes built by the real ``storyboard`` CLI on the shipped pipeline, cloned per test.

Not a test module. One episode (the sample ``ep01``) is registered and materialized once
per ledger (SQLite or PostgreSQL) and module; each test works on a copy of that home, its
Dagster instance and its ledger (a file copy, or a PostgreSQL ``TEMPLATE`` copy), so the
scenarios start from a finished run without paying for one each.

``CliEnv.invoke`` runs a command in this process (fast); :func:`storyboard` runs a real
``storyboard`` process, for what needs one (a SIGKILL at a crash point).
"""

import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cli_helpers import CliEnv, make_env
from storyboard_support import create_pg_database, drop_pg_database

from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.storyboard import sample_stories
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import engine_for

PARTITION = "demo/ep01"
EPISODE = Episode.parse(PARTITION)
SHIPPED_DEFS = "pipeline_defs.definitions:defs"


def shipped(cli: CliEnv) -> CliEnv:
    cli.defs = SHIPPED_DEFS
    return cli


def register(cli: CliEnv) -> None:
    cli.ok(
        "add-episode", "--project", EPISODE.project_id, "--episode", EPISODE.episode_id,
        "--story", str(sample_stories()[EPISODE.episode_id]),
    )  # fmt: skip


def build(root: Path, db_url: str | None = None) -> CliEnv:
    """A home where ``storyboard materialize`` has run the whole episode once."""
    cli = shipped(make_env(root, db_url))
    register(cli)
    cli.ok("materialize", "--partition", PARTITION)
    return cli


def clone(template: CliEnv, root: Path, pg_server: str | None = None) -> CliEnv:
    """An independent copy of ``template``: files, Dagster instance and ledger."""
    engine_for(template.db_url).dispose()  # SQLite: the copy sees every committed write
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(template.home, root / "home", symlinks=True)
    shutil.copytree(template.dagster_home, root / "dagster_home", symlinks=True)
    if pg_server is None:
        url = f"sqlite:///{root / 'home' / 'ledger.sqlite3'}"
    else:
        url = create_pg_database(pg_server, template.db_url)
    return shipped(CliEnv(root, root / "home", root / "dagster_home", url))


def destroy(cli: CliEnv, pg_server: str | None = None) -> None:
    if pg_server is not None:
        drop_pg_database(pg_server, cli.db_url)
    else:
        engine_for(cli.db_url).dispose()
    shutil.rmtree(cli.root, ignore_errors=True)


def storyboard(
    cli: CliEnv, *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A real ``storyboard`` process on the shipped code location."""
    script = str(Path(sys.executable).with_name("storyboard"))
    full = {**cli.subprocess_env(), **(env or {})}
    full.pop("STORYBOARD_DEFS", None)
    return subprocess.run(
        [script, *args], env=full, capture_output=True, text=True, timeout=600, cwd=cli.root
    )


def step_dir(cli: CliEnv, step_id: str) -> Path:
    return CheckpointStore(cli.home).step_dir(EPISODE.step(step_id))


def key(step_id: str) -> StepKey:
    return EPISODE.step(step_id)


def calls(cli: CliEnv) -> Counter[str]:
    """Provider calls so far, by step."""
    return Counter(c["step_id"] for c in cli.ledger.provider_calls())


def decision_of(cli: CliEnv, step_id: str) -> dict[str, Any]:
    """``storyboard decide --json``'s entry for ``step_id`` (shadow mode: no writes)."""
    payload = cli.json("decide", "--partition", PARTITION)
    found = [d for d in payload["decisions"] if d["step"] == step_id]
    assert len(found) == 1, payload
    entry: dict[str, Any] = found[0]
    return entry


def row(cli: CliEnv, step_id: str) -> LedgerRow:
    found = cli.ledger.get(key(step_id))
    assert found is not None, step_id
    return found


def status_by_step(cli: CliEnv) -> dict[str, str]:
    rows = cli.ledger.get_many(episodes=[EPISODE])
    return {k.step_id: str(r.status) for k, r in rows.items()}


# A run of one step as the resume sensor requests it (Dagster's sensor tag): the launch
# path whose recoveries are automatic. In a process of its own, so a crash point can kill it.
_SENSOR_RUN = """
import sys
from pathlib import Path

from storyboard_support import Env

root, url, step = sys.argv[1:4]
Env(Path(root), url).materialize(
    [step], tags={"dagster/sensor_name": "resume_sensor"}, raise_on_error=False
)
"""


def sensor_run(
    cli: CliEnv, step_id: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``step_id`` run by a real process as the resume sensor launches it (a home made by
    :func:`clone` has the layout ``storyboard_support.Env`` expects)."""
    full = {**cli.subprocess_env(), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", _SENSOR_RUN, str(cli.root), cli.db_url, step_id],
        env=full,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cli.root,
    )
