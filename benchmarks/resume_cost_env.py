"""The pieces of ``benchmarks/resume_cost.py``: its constants, the ledger databases, and
``Env`` (one pipeline home plus its ledger: a real Dagster launch, a copy of it).
"""

import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run on its own too (tests/core runs every file)
    sys.path.insert(0, str(ROOT))

import dagster as dg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
import yaml  # noqa: E402

from pipeline_defs.definitions import build_resources  # noqa: E402
from pipeline_defs.resume.partition import Episode, StepKey  # noqa: E402
from pipeline_defs.steps.graph import StepGraph  # noqa: E402
from pipeline_defs.steps.judge import StepJudge  # noqa: E402
from pipeline_defs.storyboard import STORYBOARD_STEPS, sample_stories  # noqa: E402
from pipeline_defs.wiring.assets import MODE_TAG, build_step_assets  # noqa: E402
from resources.ledger.store import engine_for  # noqa: E402
from resources.pipeline import PipelineResource, checkpoints_for, ledger_for  # noqa: E402

PROJECT = "bench"
EPISODE_ID = "ep01"
EPISODE = Episode(PROJECT, EPISODE_ID)
PARTITION = EPISODE.partition_key
# Small images keep the run fast; image size does not change any call count.
CONFIG: dict[str, Any] = {
    "title": "Resume cost benchmark",
    "image": {"width": 128, "height": 96},
}
STEPS = {s.step_id: s for s in STORYBOARD_STEPS}
STEP_IDS = tuple(STEPS)
ASSETS = build_step_assets(STORYBOARD_STEPS)
IMAGE_STEPS = ("ref_image_gen", "composite_image_gen", "scene_image_pipeline")
SHOT_STEP = "scene_image_pipeline"
CLAIMS = frozenset({"rerun_self", "force_explicit", "stale_running_recovery"})
POLICIES = ("a", "b", "bj", "c", "d")
POLICY_NAMES = {
    "a": "(a) ours: resume all",
    "b": "(b) naive: any doubt → force + invalidate",
    "bj": "(b*) force on our judge's doubts only",
    "c": "(c) plain Dagster: affected + downstream",
    "d": "(d) oracle",
}
# The run's event log in memory: Dagster's per-event SQLite commits dominate run time.
FAST_EVENT_LOG = {
    "event_log_storage": {
        "module": "dagster._core.storage.event_log",
        "class": "InMemoryEventLogStorage",
    }
}
# Dagster's console logger quiet: failures are read back from the run result instead.
QUIET_RUN = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
_SHM = Path("/dev/shm")


def scratch_dir(prefix: str) -> Path:
    """A fresh directory on tmpfs when possible (no fsync cost), else in the temp dir."""
    base = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=f"rc-{prefix}-", dir=base))


def downstream_of(step_ids: Iterable[str]) -> tuple[str, ...]:
    """The given steps plus everything that transitively depends on them, in pipeline order."""
    found = set(step_ids)
    changed = True
    while changed:
        changed = False
        for step in STORYBOARD_STEPS:
            if step.step_id not in found and found.intersection(step.deps):
                found.add(step.step_id)
                changed = True
    return tuple(s for s in STEP_IDS if s in found)


# ----------------------------------------------------------------------------- databases
# The name prefix of the databases this run creates (``--db-prefix``).
DB_PREFIX = "rc"


def create_pg_database(server_url: str, template: str | None = None) -> str:
    """A new database on the server (optionally a copy of ``template``'s database)."""
    name = f"{DB_PREFIX}_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        statement = f'CREATE DATABASE "{name}"'
        if template is not None:
            engine_for(template).dispose()  # TEMPLATE needs no open sessions on it
            statement += f' TEMPLATE "{sa.make_url(template).database}"'
        for attempt in range(40):  # a killed process's sessions take a moment to go away
            try:
                with admin.connect() as conn:
                    conn.exec_driver_sql(statement)
                break
            except sa.exc.OperationalError as exc:
                if "being accessed by other users" not in str(exc) or attempt == 39:
                    raise
                time.sleep(0.25)
    finally:
        admin.dispose()
    return sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_pg_database(server_url: str, url: str) -> None:
    engine_for(url).dispose()
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            name = sa.make_url(url).database
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


# ----------------------------------------------------------------------------- environments
@dataclass
class Env:
    """One pipeline home plus its ledger database."""

    root: Path
    db_url: str
    pg_server: str | None = None
    running_timeout: int | None = None

    @classmethod
    def sqlite(cls, root: Path, running_timeout: int | None = None) -> "Env":
        return cls(root, f"sqlite:///{root / 'ledger.sqlite3'}", None, running_timeout)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def pipeline(self) -> PipelineResource:
        # S6's dead run is stale once its lease lapses: a lease of the running timeout,
        # renewed at half of it (else the default lease holds the dead run for a minute).
        timeout = self.running_timeout
        return PipelineResource(
            home=str(self.home),
            db_url=self.db_url,
            running_timeout_seconds=timeout,
            lease_seconds=timeout,
            heartbeat_seconds=None if timeout is None else timeout / 2,
        )

    @property
    def ledger(self) -> Any:
        return ledger_for(self.db_url)

    @property
    def checkpoints(self) -> Any:
        return checkpoints_for(self.home)

    def key(self, step_id: str) -> StepKey:
        return StepKey(PROJECT, EPISODE_ID, step_id)

    def step_dir(self, step_id: str) -> Path:
        return Path(self.checkpoints.step_dir(self.key(step_id)))

    def write_episode(self) -> None:
        story = self.home / "projects" / PROJECT / "episodes" / EPISODE_ID / "story.md"
        story.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sample_stories()[EPISODE_ID], story)
        self.write_config(CONFIG)

    def config_path(self) -> Path:
        return self.home / "projects" / PROJECT / "project.yaml"

    def write_config(self, config: Mapping[str, Any]) -> None:
        path = self.config_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(dict(config), sort_keys=True), encoding="utf-8")

    def edit_config(self, dotted: str, value: Any) -> None:
        config = yaml.safe_load(self.config_path().read_text(encoding="utf-8")) or {}
        node = config
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        self.write_config(config)

    def judge(self, step_id: str) -> StepJudge:
        return StepJudge(
            STEPS[step_id],
            graph=StepGraph(STEPS.values()),
            settings=self.pipeline.settings(),
            ledger=self.ledger,
            checkpoints=self.checkpoints,
        )

    def materialize(self, selection: Sequence[str] | None = None, *, force: bool = False) -> Any:
        """A real Dagster launch of the (selected) assets for the partition; never raises."""
        dagster_dir = self.root / f"dagster-{uuid.uuid4().hex[:8]}"
        dagster_dir.mkdir(parents=True)
        try:
            with dg.instance_for_test(
                temp_dir=str(dagster_dir), overrides=FAST_EVENT_LOG
            ) as instance:
                instance.add_dynamic_partitions("episodes", [PARTITION])
                return dg.materialize(
                    ASSETS,
                    selection=list(selection) if selection is not None else None,
                    partition_key=PARTITION,
                    instance=instance,
                    resources=build_resources(self.pipeline),
                    tags={MODE_TAG: "force"} if force else {},
                    run_config=QUIET_RUN,
                    raise_on_error=False,
                )
        finally:
            shutil.rmtree(dagster_dir, ignore_errors=True)

    def dispose(self) -> None:
        engine_for(self.db_url).dispose()

    def clone(self) -> "Env":
        """An independent copy: home copied, ledger copied (file copy or PG template)."""
        root = scratch_dir("clone")
        shutil.copytree(self.home, root / "home")
        self.dispose()
        if self.pg_server is None:
            for suffix in ("", "-wal", "-shm"):
                source = self.root / f"ledger.sqlite3{suffix}"
                if source.exists():
                    shutil.copy2(source, root / source.name)
            return Env.sqlite(root, self.running_timeout)
        url = create_pg_database(self.pg_server, self.db_url)
        return Env(root, url, self.pg_server, self.running_timeout)

    def destroy(self) -> None:
        if self.pg_server is not None:
            drop_pg_database(self.pg_server, self.db_url)
        else:
            self.dispose()
        shutil.rmtree(self.root, ignore_errors=True)


def failures(result: Any) -> list[str]:
    """``step: first words of the failure`` for every failed step of a Dagster result."""
    out = []
    for event in result.all_events:
        if event.is_step_failure:
            data = event.event_specific_data
            failure = getattr(data, "user_failure_data", None)
            text = (failure.description if failure is not None else None) or str(data.error)
            out.append(f"{event.step_key}: {' '.join(text.split())[:90]}")
    return out
