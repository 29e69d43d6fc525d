"""Resume cost on scenarios: provider calls and step executions.

Every scenario starts from the SAME completed state: the ten assets materialized once for
episode ``ep01`` of the bundled sample (offline deterministic providers) in a template home
with its own ledger. A scenario is applied to a copy of that template (home directory copy +
ledger copy: the SQLite file, or with ``--pg-url`` a fresh PostgreSQL database created from
the template database), and each policy then runs on its own copy of the scenario state, so
the four policies see byte-identical starting points. Costs are read back from the ledger:
provider calls from ``provider_call`` (kind text/image), step executions from the audit
table ``step_transition`` (rows whose action is a claim: ``rerun_self`` (incl. "first run"),
``force_explicit``, ``stale_running_recovery`` — a step whose body ran).

Policies:

(a) ours: one ``dg.materialize`` of all ten assets for the partition, mode resume.
(b) naive "any doubt → force and invalidate downstream", with the doubts a resume sees
    without a judge that classifies them (docs/DESIGN.md#problem): every step in any way in
    doubt — not completed, checkpoint or artifact missing or invalid (read-only
    ``StepJudge.judge``: every non-SKIP decision, BLOCK included), a checkpoint edited in
    place after it was published (``mutations`` non-empty: its content hash drifted), or a
    masked project-config snapshot that differs from the current project file (a
    whole-config hash, no scoped keys). The doubted steps are launched with the run tag
    ``resume/mode=force`` (which invalidates their downstream), then all ten assets are
    resumed (staled downstream re-runs).
(b*) the same force-then-resume fed by our judge's doubts only (non-SKIP decisions): not a
    target, shown to separate the two effects (classifying doubt vs. forcing on it).
(c) plain Dagster without the judge: re-materialize the affected assets and all their
    downstream, executing every step body in that set. Modelled as ONE launch of that set
    with ``resume/mode=force`` (force runs every body; as each forced step invalidates its
    downstream, a downstream image step finds no previous checkpoint and redraws all its
    images, like an asset body that regenerates its output; the first forced image step of
    the set still keeps its own valid PNGs, since a force archives only downstream
    checkpoints). In S6 the dead run's lease is first reset (``LedgerStore.reset_running``,
    the operator's ``reset-running``), because plain Dagster has no lease that would refuse
    the re-run. "Affected" = the assets whose checkpoint or inputs the scenario changed:
    S1 scene_detail + entity_t2i (their data versions changed when t2i_review mutated them);
    S2 composite_image_gen; S3 the three image steps; S4 every asset (a project-config file
    changed and plain Dagster has no scoped config hash: the file is an input/code version
    of every asset that reads project config, i.e. all ten); S5 scene_detail; S6
    scene_image_pipeline.
(d) oracle: the minimum work, from the scenario definition: the images missing or invalid
    on disk compared with the template's records, drawn once each by the steps owning them;
    everything else zero (S5 is a BLOCK by design: 0 calls).

Scenarios:

S1  the incident: t2i_review has fixed prompts in scene_detail / entity_t2i (the template
    already contains that mutation); resume all.
S2  one composite PNG deleted.
S3  the ledger says completed but the image steps' checkpoints were restored without
    their images (every PNG of ref/composite/scene images deleted, envelopes kept).
S4  an unrelated project-config key edited (``title``).
S5  a key of scene_detail's own ``resume_config_keys`` edited (``scenes.camera_style``).
S6  a run killed with SIGKILL in the middle of scene_image_pipeline, then recovery after the
    running timeout. A real subprocess materializes scene_image_pipeline with
    ``PIPELINE_OFFLINE_LATENCY_MS`` set; it is killed once ``--kill-after`` shot PNGs exist;
    the policies run after the lease is older than the running timeout
    (``PIPELINE_RUNNING_TIMEOUT_SECONDS``, ``--running-timeout``, default 2 s; ours →
    STALE_RUNNING_RECOVERY). Two variants, both from the template:
    S6a  the shot PNGs had been lost (checkpoint kept), the resume redrawing them is killed:
         the previous checkpoint vouches for the PNGs already redrawn;
    S6b  the first run of scene_image_pipeline is killed (its checkpoint, PNGs and ledger
         row removed first): no checkpoint records the PNGs the dead run wrote.

Targets: (a) = (d) (calls and executions) in every scenario; on S1 and S4, (a) makes >= 5x
fewer provider calls than (b) and than (c). Prints PASS/FAIL per
target, a table, and saves a bar chart. Example (the command recorded in BENCHMARKS.md):

    .venv/bin/python benchmarks/resume_cost.py \\
        --pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

import argparse
import contextlib
import functools
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/resume_cost.py` from anywhere
    sys.path.insert(0, str(ROOT))

import dagster as dg  # noqa: E402
import sqlalchemy as sa  # noqa: E402
import yaml  # noqa: E402

from pipeline_defs.definitions import build_resources  # noqa: E402
from pipeline_defs.project import load_project_config  # noqa: E402
from pipeline_defs.resume.clock import parse_timestamp  # noqa: E402
from pipeline_defs.resume.decision_types import LaunchMode, ResumeAction  # noqa: E402
from pipeline_defs.resume.files import file_sha256  # noqa: E402
from pipeline_defs.resume.partition import Episode, StepKey  # noqa: E402
from pipeline_defs.steps.graph import StepGraph  # noqa: E402
from pipeline_defs.steps.judge import StepJudge  # noqa: E402
from pipeline_defs.storyboard import STORYBOARD_STEPS, sample_stories  # noqa: E402
from pipeline_defs.wiring.assets import MODE_TAG, build_step_assets  # noqa: E402
from resources.checkpoints.envelope import mask_secrets  # noqa: E402
from resources.ledger.store import engine_for  # noqa: E402
from resources.ledger.tables import step_run  # noqa: E402
from resources.pipeline import PipelineResource, checkpoints_for, ledger_for  # noqa: E402
from resources.providers.base import LATENCY_ENV  # noqa: E402

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
        return PipelineResource(
            home=str(self.home),
            db_url=self.db_url,
            running_timeout_seconds=self.running_timeout,
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


# ----------------------------------------------------------------------------- measuring
@dataclass
class Cost:
    text: int = 0
    image: int = 0
    executions: int = 0
    executed: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def calls(self) -> int:
        return self.text + self.image


def measure(env: Env, action: Callable[[Env, Cost], None]) -> Cost:
    """Run ``action`` and read back what it cost from the ledger (calls, claims, blocks)."""
    ledger = env.ledger
    seq = ledger.cursor()[0]
    last_call = max((c["id"] for c in ledger.provider_calls(episode=EPISODE)), default=0)
    cost = Cost()
    started = time.perf_counter()
    action(env, cost)
    cost.seconds = time.perf_counter() - started
    for row in ledger.transitions(since_seq=seq):
        if row.episode_id != EPISODE_ID:
            continue
        if row.action in CLAIMS:
            cost.executions += 1
            cost.executed.append(f"{row.step_id}:{row.action}")
        elif row.action == "block" and row.step_id not in cost.blocked:
            cost.blocked.append(row.step_id)
    for call in ledger.provider_calls(episode=EPISODE):
        if call["id"] > last_call:
            if call["kind"] == "text":
                cost.text += 1
            else:
                cost.image += 1
    return cost


def shadow_doubts(env: Env) -> dict[str, str]:
    """step → the judge's non-SKIP action, judged read-only for every step."""
    doubts: dict[str, str] = {}
    rows = {k.step_id: r for k, r in env.ledger.get_many(episodes=[EPISODE]).items()}
    for step_id in STEP_IDS:
        try:
            judgement = env.judge(step_id).judge(
                env.key(step_id), mode=LaunchMode.RESUME, row=rows.get(step_id)
            )
            action = judgement.decision.action
        except Exception as exc:  # a crashing verifier is a doubt too
            doubts[step_id] = f"raised {type(exc).__name__}"
            continue
        if action is not ResumeAction.SKIP:
            doubts[step_id] = action.value
    return doubts


def policy_ours(env: Env, cost: Cost) -> None:
    cost.notes.extend(failures(env.materialize()))


def drift_doubts(env: Env) -> dict[str, str]:
    """The doubts a pre-project resume saw (docs/DESIGN.md#problem): hash and whole-config drift.

    A checkpoint edited in place after it was produced (``mutations``) no longer has the
    content hash it was published with; a step whose masked config snapshot differs from the
    current project file saw "the config changed" (no scoped hash before this project).
    """
    config = mask_secrets(load_project_config(env.home, PROJECT).as_dict())
    doubts: dict[str, str] = {}
    for step_id in STEP_IDS:
        checkpoint = env.checkpoints.load(env.key(step_id))
        if checkpoint is None:
            continue
        if checkpoint.mutations:
            doubts[step_id] = "content hash drift (mutated)"
        elif dict(checkpoint.project_config_snapshot) != config:
            doubts[step_id] = "project config hash drift"
    return doubts


def policy_naive(env: Env, cost: Cost, *, judge_only: bool = False) -> None:
    doubts = shadow_doubts(env)
    if not judge_only:
        doubts = {**drift_doubts(env), **doubts}
        doubts = {s: doubts[s] for s in STEP_IDS if s in doubts}
    cost.notes.append(
        "doubts: " + (", ".join(f"{s}={a}" for s, a in doubts.items()) or "none (all SKIP)")
    )
    if doubts:
        forced = env.materialize(list(doubts), force=True)
        cost.notes.extend(f"force run: {f}" for f in failures(forced))
    cost.notes.extend(f"resume run: {f}" for f in failures(env.materialize()))


def policy_plain(affected: Sequence[str], reset_running: bool) -> Callable[[Env, Cost], None]:
    def run(env: Env, cost: Cost) -> None:
        selection = downstream_of(affected)
        cost.notes.append(f"forced set: {', '.join(selection)}")
        if reset_running:  # plain Dagster has no lease that would refuse the re-run
            for step_id in selection:
                row = env.ledger.get(env.key(step_id))
                if row is not None and row.status == "running":
                    env.ledger.reset_running(
                        env.key(step_id), row.started_at, "benchmark: plain Dagster, no lease"
                    )
                    cost.notes.append(f"lease of {step_id} reset first")
        cost.notes.extend(failures(env.materialize(selection, force=True)))

    return run


def oracle(base: Env, state: Env, *, blocked: Sequence[str] = ()) -> Cost:
    """Minimum work: each image recorded by the template but missing/invalid now, drawn once."""
    cost = Cost(blocked=list(blocked))
    for step_id in IMAGE_STEPS:
        template = base.checkpoints.load(base.key(step_id))
        assert template is not None, step_id
        missing = 0
        for entry in (template.data.get("images") or {}).values():
            path = state.step_dir(step_id) / entry["path"]
            if not path.is_file() or file_sha256(path) != entry["sha256"]:
                missing += 1
        if missing:
            cost.image += missing
            cost.executions += 1
            cost.executed.append(f"{step_id} ({missing} images)")
    if blocked:
        cost.notes.append("blocked by design: an explicit force is the user's decision")
    return cost


# ----------------------------------------------------------------------------- scenarios
@dataclass
class Scenario:
    sid: str
    title: str
    prepare: Callable[[Env], Env]  # template → a new env holding the scenario state
    affected: tuple[str, ...]
    reset_running_for_plain: bool = False
    oracle_blocked: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)


def delete_pngs(env: Env, step_ids: Iterable[str]) -> int:
    count = 0
    for step_id in step_ids:
        for png in sorted(env.step_dir(step_id).rglob("*.png")):
            if "archive" not in png.relative_to(env.step_dir(step_id)).parts:
                png.unlink()
                count += 1
    return count


def prepare_with(edit: Callable[[Env], None]) -> Callable[[Env], Env]:
    def prepare(base: Env) -> Env:
        env = base.clone()
        edit(env)
        return env

    return prepare


def edit_s2(env: Env) -> None:
    composites = sorted((env.step_dir("composite_image_gen") / "composites").glob("*.png"))
    composites[-1].unlink()


def edit_s3(env: Env) -> None:
    delete_pngs(env, IMAGE_STEPS)


def child_main(home: str, db_url: str) -> int:
    """``--child-run``: materialize scene_image_pipeline (the run that will be killed)."""
    env = Env(Path(home).parent, db_url)
    result = env.materialize([SHOT_STEP])
    print("child finished:", result.success, failures(result), flush=True)
    return 0


def kill_mid_run(
    base: Env,
    *,
    first_run: bool,
    kill_after: int,
    latency_ms: int,
    running_timeout: int,
    facts: dict[str, Any],
) -> Env:
    env = base.clone()
    env.running_timeout = running_timeout
    shots = env.step_dir(SHOT_STEP) / "shots"
    expected = len(list(shots.glob("*.png")))
    if first_run:  # the step has never completed: no checkpoint, no PNGs, no ledger row
        shutil.rmtree(env.step_dir(SHOT_STEP))
        with env.ledger.engine.begin() as conn:
            conn.execute(
                sa.delete(step_run).where(
                    step_run.c.project_id == PROJECT,
                    step_run.c.episode_id == EPISODE_ID,
                    step_run.c.step_id == SHOT_STEP,
                )
            )
    else:  # the shots were lost; the resume that redraws them is the run killed
        delete_pngs(env, [SHOT_STEP])
    calls_before = len(env.ledger.provider_calls(env.key(SHOT_STEP)))
    env.dispose()
    log_path = env.root / "child.log"
    child_env = {**os.environ, LATENCY_ENV: str(latency_ms)}
    child_args = [str(env.home), env.db_url]
    with log_path.open("wb") as log:
        child = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child-run", *child_args],
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        try:
            while True:
                written = len(list(shots.glob("*.png"))) if shots.is_dir() else 0
                if written >= kill_after:
                    os.kill(child.pid, signal.SIGKILL)
                    break
                if child.poll() is not None:
                    raise RuntimeError(
                        "the run finished before it could be killed: "
                        + log_path.read_text()[-2000:]
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError("the run to kill wrote no PNG in 300 s")
                time.sleep(0.02)
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            child.wait()
    row = env.ledger.get(env.key(SHOT_STEP))
    assert row is not None and row.status == "running", row
    written = len(list(shots.glob("*.png")))
    facts.update(
        {
            "expected_shots": expected,
            "shots_on_disk_at_kill": written,
            "killed_run_image_calls": len(env.ledger.provider_calls(env.key(SHOT_STEP)))
            - calls_before,
            "killed_returncode": child.returncode,
        }
    )
    # Wait until the dead run's lease is older than the running timeout.
    started = parse_timestamp(row.started_at)
    assert started is not None
    wait = running_timeout + 0.5 - (datetime.now(UTC) - started).total_seconds()
    if wait > 0:
        time.sleep(wait)
    return env


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    def kill(first_run: bool, facts: dict[str, Any]) -> Callable[[Env], Env]:
        def prepare(base: Env) -> Env:
            return kill_mid_run(
                base,
                first_run=first_run,
                kill_after=args.kill_after,
                latency_ms=args.latency_ms,
                running_timeout=args.running_timeout,
                facts=facts,
            )

        return prepare

    s6a: dict[str, Any] = {}
    s6b: dict[str, Any] = {}
    return [
        Scenario(
            "S1",
            "after t2i_review fixed prompts, resume all",
            prepare_with(lambda env: None),
            ("scene_detail", "entity_t2i"),
        ),
        Scenario(
            "S2", "one composite PNG deleted", prepare_with(edit_s2), ("composite_image_gen",)
        ),
        Scenario(
            "S3",
            "image checkpoints restored without their PNGs",
            prepare_with(edit_s3),
            IMAGE_STEPS,
        ),
        Scenario(
            "S4",
            "unrelated config key edited (title)",
            prepare_with(lambda env: env.edit_config("title", "A retitled project")),
            STEP_IDS,
        ),
        Scenario(
            "S5",
            "scene_detail's own key edited (scenes.camera_style)",
            prepare_with(lambda env: env.edit_config("scenes.camera_style", "handheld 16mm")),
            ("scene_detail",),
            oracle_blocked=("scene_detail",),
        ),
        Scenario(
            "S6a",
            "SIGKILL mid scene_image_pipeline (redraw of lost shots), recover",
            kill(False, s6a),
            (SHOT_STEP,),
            reset_running_for_plain=True,
            facts=s6a,
        ),
        Scenario(
            "S6b",
            "SIGKILL mid scene_image_pipeline (its first run), recover",
            kill(True, s6b),
            (SHOT_STEP,),
            reset_running_for_plain=True,
            facts=s6b,
        ),
    ]


# ----------------------------------------------------------------------------- reporting
def cell(cost: Cost) -> str:
    blocked = f", blocked: {', '.join(cost.blocked)}" if cost.blocked else ""
    return f"{cost.text}/{cost.image} ({cost.executions} exec{blocked})"


def markdown_table(results: Mapping[str, Mapping[str, Cost]], titles: Mapping[str, str]) -> str:
    lines = [
        "| scenario | policy | text calls | image calls | total calls "
        "| step executions | blocked? | seconds |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for sid, row in results.items():
        for policy in POLICIES:
            cost = row[policy]
            blocked = ("yes: " + ", ".join(cost.blocked)) if cost.blocked else "no"
            seconds = f"{cost.seconds:.1f}" if policy != "d" else "—"
            lines.append(
                f"| {sid} {titles[sid]} | {POLICY_NAMES[policy]} | {cost.text} | {cost.image} "
                f"| {cost.calls} | {cost.executions} | {blocked} | {seconds} |"
            )
    return "\n".join(lines)


def compact_table(results: Mapping[str, Mapping[str, Cost]]) -> str:
    """Scenario rows, one column per policy: text/image calls (step executions)."""
    head = "| scenario | " + " | ".join(POLICY_NAMES[p] for p in POLICIES) + " |"
    lines = [head, "|---|" + "---|" * len(POLICIES)]
    for sid, row in results.items():
        lines.append(f"| {sid} | " + " | ".join(cell(row[p]) for p in POLICIES) + " |")
    return "\n".join(lines)


def check_targets(results: Mapping[str, Mapping[str, Cost]]) -> list[tuple[str, bool, str]]:
    checks: list[tuple[str, bool, str]] = []
    for sid, row in results.items():
        a, d = row["a"], row["d"]
        same = (a.text, a.image, a.executions, bool(a.blocked)) == (
            d.text,
            d.image,
            d.executions,
            bool(d.blocked),
        )
        checks.append(
            (
                f"{sid}: (a) = (d)",
                same,
                f"ours {a.text}/{a.image} calls, {a.executions} exec"
                f"{' blocked' if a.blocked else ''}; oracle {d.text}/{d.image} calls, "
                f"{d.executions} exec{' blocked' if d.blocked else ''}",
            )
        )
    for sid in ("S1", "S4"):
        if sid not in results:
            continue
        a = results[sid]["a"]
        for other in ("b", "c"):
            o = results[sid][other]
            ok = o.calls > 0 and a.calls * 5 <= o.calls
            if o.calls == 0:
                why = "it makes 0 calls too: nothing to be 5x fewer than"
            else:
                ratio = "inf" if a.calls == 0 else f"{o.calls / a.calls:.1f}"
                why = f"ours {a.calls} vs {o.calls} calls: {ratio}x"
            checks.append((f"{sid}: (a) >= 5x fewer calls than ({other})", ok, why))
    return checks


SHORT = {
    "S1": "review fixed prompts",
    "S2": "1 composite PNG lost",
    "S3": "image PNGs lost",
    "S4": "title edited",
    "S5": "scene_detail key edited",
    "S6a": "SIGKILL (redraw run)",
    "S6b": "SIGKILL (first run)",
}


def save_chart(
    results: Mapping[str, Mapping[str, Cost]], path: Path, titles: Mapping[str, str]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sids = list(results)
    colors = {"a": "#2b8a3e", "b": "#c92a2a", "bj": "#862e9c", "c": "#e67700", "d": "#495057"}
    width = 0.16
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=90)
    for i, policy in enumerate(POLICIES):
        xs = [n + (i - (len(POLICIES) - 1) / 2) * width for n in range(len(sids))]
        values = [results[s][policy].calls for s in sids]
        bars = ax.bar(xs, values, width, label=POLICY_NAMES[policy], color=colors[policy])
        for bar, sid in zip(bars, sids, strict=True):
            cost = results[sid][policy]
            label = f"{cost.calls}" + ("\nblocked" if cost.blocked else "")
            ax.annotate(
                label,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=6.5,
            )
    ax.set_xticks(range(len(sids)))
    ax.set_xticklabels([f"{s}\n{SHORT.get(s, titles[s][:18])}" for s in sids], fontsize=7.5)
    ax.set_ylabel("provider calls (text + image)")
    ax.set_title("Resume cost per scenario: provider calls by policy", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    ax.margins(y=0.12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def build_template(args: argparse.Namespace) -> tuple[Env, Cost]:
    root = scratch_dir("template")
    if args.pg_url:
        env = Env(root, create_pg_database(args.pg_url), args.pg_url)
    else:
        env = Env.sqlite(root)
    env.write_episode()
    cost = measure(env, policy_ours)
    rows = env.ledger.get_many(episodes=[EPISODE])
    statuses = {k.step_id: r.status for k, r in rows.items()}
    if statuses != dict.fromkeys(STEP_IDS, "completed") or cost.notes:
        raise RuntimeError(f"template run did not complete: {statuses} {cost.notes}")
    scene_detail = env.checkpoints.load(env.key("scene_detail"))
    assert scene_detail is not None and scene_detail.mutations, "t2i_review did not mutate"
    return env, cost


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--pg-url",
        default=None,
        help="PostgreSQL server URL: the template ledger and a fresh database per "
        "(scenario, policy) are created there (default: SQLite file copies)",
    )
    parser.add_argument(
        "--scenarios",
        default="S1,S2,S3,S4,S5,S6a,S6b",
        help="scenarios run, comma separated (default all: S1,S2,S3,S4,S5,S6a,S6b)",
    )
    parser.add_argument("--kill-after", type=int, default=3, help="S6: shot PNGs before SIGKILL")
    parser.add_argument("--latency-ms", type=int, default=300, help="S6: offline latency/call")
    parser.add_argument("--running-timeout", type=int, default=2, help="S6: seconds")
    parser.add_argument(
        "--chart",
        type=Path,
        default=ROOT / "benchmarks/results/resume_cost.png",
        help="where the chart is written (default benchmarks/results/resume_cost.png)",
    )
    parser.add_argument(
        "--db-prefix",
        default="rc",
        help="name prefix of the PostgreSQL databases it creates and drops (default rc)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a short run (CI): scenario S2 only, the chart into a temporary directory",
    )
    parser.add_argument("--child-run", nargs=2, metavar=("HOME", "DB_URL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_run:
        return child_main(*args.child_run)
    global DB_PREFIX
    DB_PREFIX = args.db_prefix
    if args.smoke:
        args.scenarios = "S2"
        args.chart = Path(tempfile.mkdtemp(prefix="resume-cost-smoke-")) / "resume_cost.png"

    wanted = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    started = time.perf_counter()
    print(
        f"# resume cost  {datetime.now(UTC):%Y-%m-%d %H:%M} UTC  python {platform.python_version()}"
        f"  dagster {dg.__version__}  ledger {'postgresql' if args.pg_url else 'sqlite'}"
        f"  cpus {os.cpu_count()}  load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    base, full = build_template(args)
    print(
        f"template: full pipeline = {full.text} text + {full.image} image calls, "
        f"{full.executions} step executions ({full.seconds:.1f} s)",
        flush=True,
    )
    results: dict[str, dict[str, Cost]] = {}
    titles: dict[str, str] = {}
    facts: dict[str, dict[str, Any]] = {}
    try:
        for scenario in scenarios(args):
            if scenario.sid not in wanted:
                continue
            titles[scenario.sid] = scenario.title
            state = scenario.prepare(base)
            try:
                row: dict[str, Cost] = {}
                policies: dict[str, Callable[[Env, Cost], None]] = {
                    "a": policy_ours,
                    "b": policy_naive,
                    "bj": functools.partial(policy_naive, judge_only=True),
                    "c": policy_plain(scenario.affected, scenario.reset_running_for_plain),
                }
                for policy, action in policies.items():
                    env = state.clone()
                    try:
                        row[policy] = measure(env, action)
                    finally:
                        env.destroy()
                row["d"] = oracle(base, state, blocked=scenario.oracle_blocked)
            finally:
                state.destroy()
            results[scenario.sid] = row
            facts[scenario.sid] = dict(scenario.facts)
            print(f"{scenario.sid} {scenario.title}", flush=True)
            if scenario.facts:
                print(f"   facts: {scenario.facts}")
            for policy in POLICIES:
                cost = row[policy]
                print(f"   {POLICY_NAMES[policy]:<42} {cell(cost)}  ({cost.seconds:.1f} s)")
                for note in cost.notes:
                    print(f"      - {note}")
                if cost.executed:
                    print(f"      - executed: {', '.join(cost.executed)}")
    finally:
        base.destroy()

    print("\n" + compact_table(results))
    print("\n" + markdown_table(results, titles))
    print("\nTargets:")
    checks = check_targets(results)
    for name, ok, why in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}  — {why}")
    save_chart(results, args.chart, titles)
    print(f"\nchart: {args.chart}  total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
