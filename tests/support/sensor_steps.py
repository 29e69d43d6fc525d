"""Test-only steps for the resume sensor: ``src`` → ``mid`` → ``end``, and ``src`` → ``side``.

Not product code. Each step writes one small artifact (``mid`` into a sub-directory, so
the sensor's tree identity must follow artifact sub-directories). Behaviour is driven by
files in the episode input directory ``projects/<p>/episodes/<e>/`` (inputs the sensor
watches):

- ``verify.json`` ``{"<step>": "drift" | "typed" | "crash" | "missing"}``: what that step's
  ``verify_completion`` reports (invariant drift, a typed error = contract drift, a
  KeyError = verify crashed, artifact missing);
- ``no_side``: ``side`` is not applicable.

``end`` scopes its config hash to ``style``. ``VERIFY_CALLS`` counts verifier calls per
step in this process (timing-free instrumentation of how much a tick judged).
"""

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa
from cli_helpers import dump_tables

from pipeline_defs.definitions import build_defs, build_resources
from pipeline_defs.judging.stores import Stores
from pipeline_defs.project import project_config_path
from pipeline_defs.resume.completion import CompletionReport, Origin
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.steps.context import StepContext, VerifyContext
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.runner import RunInfo, StepRunner
from pipeline_defs.steps.spec import Step, StepResult
from pipeline_defs.wiring.assets import build_step_assets, episodes
from resources.checkpoints.envelope import Checkpoint
from resources.ledger.tables import step_run
from resources.pipeline import PipelineResource

VERIFY_CALLS: Counter[str] = Counter()


def _verify_mode(ctx: VerifyContext, step_id: str) -> str | None:
    path = ctx.episode_dir / "verify.json"
    if not path.exists():
        return None
    modes: dict[str, str] = json.loads(path.read_text())
    return modes.get(step_id)


class _SensorStep(Step):
    artifact = "out.bin"

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        payload = f"{self.step_id}:{ctx.key.partition_key}:{sorted(inputs)}".encode()
        art = ctx.write_artifact(self.artifact, payload)
        return StepResult(data={"step": self.step_id, "inputs": sorted(inputs)}, artifacts=(art,))

    def verify_completion(self, ctx: VerifyContext, checkpoint: Checkpoint) -> CompletionReport:
        VERIFY_CALLS[self.step_id] += 1
        mode = _verify_mode(ctx, self.step_id)
        if mode == "drift":
            return CompletionReport.incomplete(Origin.INVARIANT_DRIFT, ("sentinel hash",))
        if mode == "typed":
            raise PipelineError("step.contract", "sentinel card is malformed")
        if mode == "crash":
            raise KeyError("recompute helper")
        if mode == "missing":
            return CompletionReport.incomplete(Origin.ARTIFACT_MISSING, ("row 7",))
        return CompletionReport.clean()


class Src(_SensorStep):
    step_id = "src"


class Mid(_SensorStep):
    step_id = "mid"
    deps = ("src",)
    artifact = "frames/f0.png"


class End(_SensorStep):
    step_id = "end"
    deps = ("mid",)
    resume_config_keys = ("style",)

    def verify_reads(self, ctx: VerifyContext) -> tuple[Path, ...]:
        return (project_config_path(ctx.home, ctx.key.project_id),)  # declared, sealed


class Side(_SensorStep):
    step_id = "side"
    deps = ("src",)

    def is_applicable(self, ctx: VerifyContext) -> bool:
        return not (ctx.episode_dir / "no_side").exists()


SENSOR_STEPS: tuple[Step, ...] = (Src(), Mid(), End(), Side())


def sensor_defs() -> dg.Definitions:
    """The code location of these steps, for the CLI
    (``STORYBOARD_DEFS=sensor_steps:sensor_defs``)."""
    return build_defs(SENSOR_STEPS)


def materialize(
    instance: dg.DagsterInstance,
    pipeline: PipelineResource,
    partition_key: str,
    steps: Sequence[str] | None = None,
    *,
    tags: Mapping[str, str] | None = None,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    """A real Dagster materialization of some (default: all) sensor steps of one partition."""
    if partition_key not in instance.get_dynamic_partitions(str(episodes.name)):
        instance.add_dynamic_partitions(str(episodes.name), [partition_key])
    assets = build_step_assets(SENSOR_STEPS)
    selection = [dg.AssetKey(s) for s in steps] if steps is not None else None
    return dg.materialize(
        assets,
        partition_key=partition_key,
        instance=instance,
        resources=build_resources(pipeline),
        selection=selection,
        tags=dict(tags or {}),
        raise_on_error=raise_on_error,
    )


def write_input(home: Path, partition_key: str, name: str, content: Any) -> Path:
    """Write (or with content None, delete) a file in the episode input directory."""
    project, episode = partition_key.split("/")
    path = Path(home) / "projects" / project / "episodes" / episode / name
    if content is None:
        path.unlink(missing_ok=True)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


# ---------------------------------------------------------------------- state seeding
def stores_for(home: Path, db_url: str, **settings: Any) -> Stores:
    """The three stores of a test pipeline home (settings overrides as keyword args)."""
    pipeline = PipelineResource(home=str(home), db_url=db_url, **settings)
    stores = Stores.of(pipeline)
    stores.ledger.migrate()
    return stores


def step_judge(stores: Stores, step_id: str) -> StepJudge:
    graph = StepGraph(SENSOR_STEPS)
    return StepJudge(
        graph.step(step_id),
        graph=graph,
        settings=stores.settings,
        ledger=stores.ledger,
        checkpoints=stores.checkpoints,
    )


def runtime(stores: Stores, step_id: str) -> StepRunner:
    return StepRunner(
        step_judge(stores, step_id), ledger=stores.ledger, checkpoints=stores.checkpoints
    )


def seed(stores: Stores, partition_key: str, *step_ids: str, run_id: str = "seed") -> None:
    """Run steps through the real (Dagster-free) run protocol: completed rows + checkpoints."""
    for step_id in step_ids or tuple(s.step_id for s in SENSOR_STEPS):
        rt = runtime(stores, step_id)
        key = rt.judge.key(partition_key)
        inputs = {
            dep: stores.checkpoints.load(StepKey(key.project_id, key.episode_id, dep))
            for dep in rt.step.deps
        }
        rt.run(partition_key, RunInfo(f"{run_id}-{step_id}:0", launch_path="test"), inputs)


def set_row(stores: Stores, key: StepKey, **values: Any) -> None:
    """Test-only direct edit of a ledger row (states no ledger operation produces)."""
    with stores.ledger.engine.begin() as conn:
        conn.execute(
            sa.update(step_run)
            .where(
                step_run.c.project_id == key.project_id,
                step_run.c.episode_id == key.episode_id,
                step_run.c.step_id == key.step_id,
            )
            .values(**values)
        )


def snapshot(stores: Stores) -> tuple[Any, ...]:
    """Every row of every ledger table (the settings and their audit too), and every file
    under the home (bytes), for diffs."""
    tables = dump_tables(stores.ledger.engine)
    home = stores.checkpoints.home
    files = {
        str(p.relative_to(home)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(home.rglob("*"))
        if p.is_file() and not p.name.startswith("ledger.sqlite3")
    }
    dirs = sorted(
        (str(p.relative_to(home)), p.stat().st_mtime_ns) for p in home.rglob("*") if p.is_dir()
    )
    return tables, files, dirs


def delete_row(stores: Stores, key: StepKey) -> None:
    """Test-only removal of a ledger row (e.g. a wiped database)."""
    with stores.ledger.engine.begin() as conn:
        conn.execute(
            sa.delete(step_run).where(
                step_run.c.project_id == key.project_id,
                step_run.c.episode_id == key.episode_id,
                step_run.c.step_id == key.step_id,
            )
        )
