"""What the CLI operates on: the code location's Definitions, its steps, stores and instance.

The Definitions come from ``STORYBOARD_DEFS=module:attr`` (read at command time; default
``pipeline_defs.definitions:defs``), so tests and alternative code locations can point the
CLI at other steps without touching the real pipeline.
"""

import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from pipeline_defs.resume.errors import ErrorCode, LedgerNotMigrated, PipelineError
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import Episode, validate_id
from pipeline_defs.resume.settings import ENV_NAMES, EffectiveSettings, ResumeSettings
from pipeline_defs.resume.settings_registry import read
from pipeline_defs.steps.graph import StepGraph, order_steps
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.lease import RunLease
from pipeline_defs.steps.spec import Step, load_step
from pipeline_defs.wiring.assets import episodes
from pipeline_defs.wiring.io_manager import STEP_METADATA_KEY
from pipeline_defs.wiring.run_lease import run_lease
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import MIGRATIONS_DIR, LedgerStore
from resources.pipeline import PipelineResource

DEFS_ENV = "STORYBOARD_DEFS"
DEFAULT_DEFS = "pipeline_defs.definitions:defs"
PARTITIONS_NAME = str(episodes.name)


def definitions_spec(spec: str | None = None) -> str:
    """``spec``, else ``STORYBOARD_DEFS``, else the shipped code location."""
    return spec or os.environ.get(DEFS_ENV) or DEFAULT_DEFS


def load_definitions(spec: str | None = None) -> dg.Definitions:
    """Import ``module:attr``; the attribute is a Definitions or a factory returning one."""
    spec = definitions_spec(spec)
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise PipelineError(
            ErrorCode.INPUT_INVALID, f"{DEFS_ENV}={spec!r}: expected module:attribute"
        )
    try:
        target: Any = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PipelineError(
            ErrorCode.INPUT_INVALID,
            f"{DEFS_ENV}={spec!r}: cannot load it ({type(exc).__name__}: {exc})",
        ) from None
    if not isinstance(target, dg.Definitions) and callable(target):
        target = target()
    if not isinstance(target, dg.Definitions):
        raise PipelineError(
            ErrorCode.INPUT_INVALID,
            f"{DEFS_ENV}={spec!r} is a {type(target).__name__}, not Definitions",
        )
    return target


def _asset_specs(defs: dg.Definitions) -> list[dg.AssetSpec]:
    """Asset specs in declaration order (stable across processes)."""
    specs: list[dg.AssetSpec] = []
    for item in defs.assets or ():
        if isinstance(item, dg.AssetsDefinition):
            specs.extend(item.specs)
        elif isinstance(item, dg.AssetSpec):
            specs.append(item)
    return specs or list(defs.resolve_all_asset_specs())


def steps_of(defs: dg.Definitions) -> tuple[Step, ...]:
    """The judged steps of a code location, read back from its asset metadata."""
    found: dict[str, Step] = {}
    for spec in _asset_specs(defs):
        path = spec.metadata.get(STEP_METADATA_KEY)
        if path is None:
            continue
        found[spec.key.to_user_string()] = load_step(str(getattr(path, "value", path)))
    return order_steps(found.values())


class _NoDefaultConfigNotice(logging.Filter):
    """Drop Dagster's "no dagster.yaml, using defaults" notice: the default is intended."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No dagster instance configuration file")


def quiet_dagster_notices() -> None:
    logger = logging.getLogger("dagster")
    if not any(isinstance(f, _NoDefaultConfigNotice) for f in logger.filters):
        logger.addFilter(_NoDefaultConfigNotice())


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Dagster's first-use notices go to stderr, never into ``--json`` output."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


# Where ``make demo`` and ``make dev`` keep the Dagster instance, beside ``./.pipeline``.
DEMO_DAGSTER_HOME = ".dagster_home"


def dagster_instance(*, required: bool = True) -> dg.DagsterInstance | None:
    """The instance of ``DAGSTER_HOME`` (created if the directory is missing), or None.

    ``DAGSTER_HOME`` unset: the demo's instance, ``./.dagster_home`` in the current directory,
    when ``make demo`` made one there (as ``PIPELINE_HOME`` defaults to ``./.pipeline``), so
    ``storyboard materialize`` right after ``make demo`` works without make's environment."""
    home = os.environ.get("DAGSTER_HOME", "").strip()
    demo = Path.cwd() / DEMO_DAGSTER_HOME
    if not home and (demo / "dagster.yaml").is_file():
        with stdout_to_stderr():
            return dg.DagsterInstance.from_config(str(demo))
    if not home:
        if not required:
            return None
        raise PipelineError(
            ErrorCode.CONFIG_DAGSTER_HOME,
            "DAGSTER_HOME is not set: runs and partitions need a persistent Dagster instance; "
            "export DAGSTER_HOME=$PWD/.dagster_home (an absolute path) and retry",
        )
    path = Path(home)
    if not path.is_absolute():
        raise PipelineError(
            ErrorCode.CONFIG_DAGSTER_HOME, f"DAGSTER_HOME={home!r} must be an absolute path"
        )
    path.mkdir(parents=True, exist_ok=True)
    with stdout_to_stderr():
        return dg.DagsterInstance.get()


@dataclass
class Workspace:
    """The code location as the CLI sees it: steps in dependency order, stores, settings."""

    defs: dg.Definitions
    steps: tuple[Step, ...]
    pipeline: PipelineResource
    _instance: dg.DagsterInstance | None = field(default=None, repr=False)
    # module:attr the Definitions came from: a Celery worker rebuilds the job from it.
    spec: str = DEFAULT_DEFS
    # Malformed keys found among the registered partitions (key -> why), reported once.
    invalid_partitions: dict[str, PipelineError] = field(default_factory=dict, repr=False)

    @cached_property
    def effective_settings(self) -> EffectiveSettings:
        """The settings in force (env, then the ledger's table, then defaults) and sources."""
        return self.pipeline.effective_settings()

    @cached_property
    def settings(self) -> ResumeSettings:
        return self.effective_settings.settings

    # The stores are found from the location settings alone: a bad limit in the ledger's
    # table must not keep an operator from reaching the ledger to repair it.
    @cached_property
    def ledger(self) -> LedgerStore:
        return self.pipeline.ledger()

    @cached_property
    def checkpoints(self) -> CheckpointStore:
        return self.pipeline.checkpoints()

    @property
    def home(self) -> Path:
        return Path(self.pipeline.location().home)

    def run_lease(self, run_id: str) -> RunLease:
        """The lease this process holds while it coordinates ``run_id`` in process."""
        return run_lease(self.pipeline, run_id)

    @property
    def catalog(self) -> dict[str, Step]:
        return {s.step_id: s for s in self.steps}

    def step(self, step_id: str) -> Step:
        validate_id(step_id, "step_id")
        try:
            return self.catalog[step_id]
        except KeyError:
            known = ", ".join(self.catalog) or "none"
            raise PipelineError(
                ErrorCode.INPUT_INVALID, f"unknown step {step_id!r}; the code location has: {known}"
            ) from None

    def judge(self, step: Step) -> StepJudge:
        """The read-only judge of one step."""
        return StepJudge(
            step,
            graph=StepGraph(self.steps),
            settings=self.settings,
            ledger=self.ledger,
            checkpoints=self.checkpoints,
        )

    def require_migrated_ledger(self) -> None:
        """Refuse (instead of creating or migrating) a ledger that is not at the head revision.

        Read-only commands call this first, so they never write schema into a database.
        """
        from alembic.runtime.migration import MigrationContext

        url = self.ledger.url
        parsed = sa.engine.make_url(url)
        hint = "run `storyboard migrate` first"
        if parsed.get_backend_name() == "sqlite":
            database = parsed.database or ""
            if database in ("", ":memory:") or not Path(database).is_file():
                raise PipelineError(ErrorCode.LEDGER_NOT_MIGRATED, self._missing_ledger(database))
        with self.ledger.engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
        head = ledger_head()
        if current != head:
            raise PipelineError(
                ErrorCode.LEDGER_NOT_MIGRATED,
                f"ledger {safe_url(url)} is at revision {current!r}, not {head!r}; {hint}",
            )

    def ledger_ready(self) -> bool:
        """Whether the ledger exists at the head revision (checked without writing to it)."""
        try:
            self.require_migrated_ledger()
        except LedgerNotMigrated:
            return False
        return True

    def home_source(self) -> str | None:
        """Who set the data root (None: nobody, it is the default ``./.pipeline``)."""
        if self.pipeline.home:
            return "set by the code location's pipeline resource"
        if read(ENV_NAMES["home"]).strip():
            return "from the environment"
        return None

    def _missing_ledger(self, database: str) -> str:
        """Why an embedded ledger file is missing, and what to do, without guessing wrong.

        Run from another directory, the default data root is a fresh ``./.pipeline`` there:
        suggesting ``storyboard migrate`` would create an empty ledger in a place nobody
        meant, so the message names the data root used and how to point at the real one.
        """
        found = f"ledger database {database!r} does not exist"
        migrate = "or run `storyboard migrate` to create a new, empty ledger there"
        if self.pipeline.db_url or read(ENV_NAMES["db_url"]).strip():
            return f"{found} ({ENV_NAMES['db_url']}); check {ENV_NAMES['db_url']}, {migrate}"
        home = self.home.resolve()
        source = self.home_source()
        origin = source or (
            f"not set: defaults to ./.pipeline relative to the current directory {Path.cwd()}"
        )
        where = f"PIPELINE_HOME={home} ({origin})"
        point = "export PIPELINE_HOME=/absolute/path/to/the/project/.pipeline"
        if source is None and not home.is_dir():
            return (
                f"{found}: {where}; run storyboard from the project directory, or point it "
                f"at the existing data root: {point}"
            )
        return f"{found}: {where}; if that is the wrong data root: {point}; {migrate}"

    def instance(self, *, required: bool = True) -> dg.DagsterInstance | None:
        if self._instance is None:
            self._instance = dagster_instance(required=required)
        return self._instance

    def job(self) -> dg.JobDefinition:
        """The implicit asset job (``__ASSET_JOB``) with the code location's resources."""
        return self.defs.resolve_implicit_global_asset_job_def()

    def registered_episodes(self) -> list[Episode] | None:
        """Partitions registered in the Dagster instance; None without an instance.

        A malformed key (``oops no slash``, ``demo/ep01/x``: Dagster's API and UI accept any
        text) is skipped and kept in ``invalid_partitions`` for the command to report once:
        one bad key must not make a command fail for every partition.
        """
        instance = self.instance(required=False)
        if instance is None:
            return None
        found: list[Episode] = []
        for key in instance.get_dynamic_partitions(PARTITIONS_NAME):
            try:
                found.append(Episode.parse(key))
            except PipelineError as exc:
                self.invalid_partitions.setdefault(key, exc)
        return found

    def known_episodes(self) -> list[Episode]:
        """Registered partitions, partitions with ledger rows and episode folders."""
        keys: set[Episode] = set(self.registered_episodes() or ())
        keys.update(k.episode for k in self.ledger.get_many())
        layout = DataLayout.of(self.home)
        for story in Path(layout.projects).glob(layout.story_files_pattern):
            with contextlib.suppress(PipelineError):  # a folder name that is no id
                keys.add(Episode(story.parent.parent.parent.name, story.parent.name))
        return sorted(keys)

    def require_partitions(
        self, partition_keys: Iterable[str], *, registration_required: bool = True
    ) -> list[Episode]:
        """The episodes of ``partition_keys``; a key the instance does not know is refused.

        Every command taking ``--partition`` calls this, so each refuses an unknown
        partition with the same message and exit code (instead of showing ten ``none``
        rows, or a launch the sensor would never make). With ``registration_required=False``
        (read-only views, ledger repairs) a partition the ledger or the episode folders
        still know is accepted too: a ledger outlives a wiped Dagster instance.
        """
        episodes = [Episode.parse(k) for k in dict.fromkeys(partition_keys)]
        instance = self.instance(required=registration_required)
        for episode in episodes:
            key = episode.partition_key
            if instance is not None and instance.has_dynamic_partition(PARTITIONS_NAME, key):
                continue
            if not registration_required and self._has_traces(episode):
                continue
            where = instance.root_directory if instance is not None else "DAGSTER_HOME not set"
            raise PipelineError(
                ErrorCode.INPUT_INVALID,
                f"partition {key!r} is not registered in the Dagster instance ({where}); "
                "add it with `storyboard add-episode`",
            )
        return episodes

    def _has_traces(self, episode: Episode) -> bool:
        """Ledger rows or an episode folder (read-only: an unmigrated ledger has no rows)."""
        story = DataLayout.of(self.home).story_file(episode.project_id, episode.episode_id)
        if os.path.isfile(story):
            return True
        return self.ledger_ready() and bool(self.ledger.get_many(episodes=[episode]))


def ledger_head() -> str:
    """The Alembic head revision of the ledger schema."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return str(ScriptDirectory.from_config(cfg).get_current_head())


def safe_url(url: str) -> str:
    """A database URL with its password hidden."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparseable url>"


def load_workspace(spec: str | None = None) -> Workspace:
    spec = definitions_spec(spec)
    defs = load_definitions(spec)
    resources = defs.resources or {}
    pipeline = resources.get("pipeline")
    if not isinstance(pipeline, PipelineResource):
        pipeline = PipelineResource()
    return Workspace(defs=defs, steps=steps_of(defs), pipeline=pipeline, spec=spec)
