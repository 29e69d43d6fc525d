"""Harness of the storyboard tests: homes with a sample story, Dagster and direct runs.

Not a test module: the ``test_storyboard_*`` files import it. Scratch data goes to
``/dev/shm`` when available because fsync dominates these runs on disk.
"""

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import dagster as dg
import sqlalchemy as sa
import yaml

from pipeline_defs.definitions import build_resources
from pipeline_defs.operations.operator_words import DECISION_ACTIONS
from pipeline_defs.resume.decision_types import LaunchMode, ResumeDecision
from pipeline_defs.resume.layout import FORCE_MARKER, SCRATCH_DIR
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.runner import RunInfo, StepOutcome, StepRunner
from pipeline_defs.storyboard import STORYBOARD_STEPS, sample_stories
from pipeline_defs.wiring.assets import build_step_assets
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.manifest import Manifest
from resources.checkpoints.published import scratch_cache_of
from resources.checkpoints.scratch_cache import ScratchCache
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore, engine_for
from resources.ledger.tables import step_run
from resources.pipeline import PipelineResource, checkpoints_for, ledger_for
from resources.providers import ImageModel, TextModel

PROJECT = "demo"
EPISODE_ID = "ep01"
EPISODE = Episode(PROJECT, EPISODE_ID)
PARTITION = EPISODE.partition_key
# Small images keep the suite fast; ref_min_mentions 3 makes the sample's cat a skipped extra.
TEST_CONFIG: dict[str, Any] = {
    "image": {"width": 128, "height": 96},
    "images": {"ref_min_mentions": 3},
}
STEPS = {s.step_id: s for s in STORYBOARD_STEPS}
STEP_IDS = tuple(STEPS)
PRE_REVIEW = STEP_IDS[: STEP_IDS.index("t2i_review")]
ASSETS = build_step_assets(STORYBOARD_STEPS)
_SHM = Path("/dev/shm")
# The run's event log in memory: Dagster's per-event SQLite commits dominate test time.
FAST_EVENT_LOG = {
    "event_log_storage": {
        "module": "dagster._core.storage.event_log",
        "class": "InMemoryEventLogStorage",
    }
}


def scratch_dir(prefix: str) -> Path:
    """A fresh directory on tmpfs when possible (no fsync cost), else in the temp dir."""
    base = _SHM if _SHM.is_dir() and os.access(_SHM, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=f"sb-{prefix}-", dir=base))


def write_config(home: Path, config: Mapping[str, Any], project: str = PROJECT) -> Path:
    path = home / "projects" / project / "project.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(config), sort_keys=True), encoding="utf-8")
    return path


def edit_config(home: Path, dotted: str, value: Any, project: str = PROJECT) -> None:
    path = home / "projects" / project / "project.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    node = config
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    write_config(home, config, project)


def write_episode(
    home: Path,
    *,
    story: str | bytes | None = None,
    config: Mapping[str, Any] | None = TEST_CONFIG,
    episode: str = EPISODE_ID,
) -> Path:
    """``projects/demo/episodes/<e>/story.md`` (the sample by default) and project.yaml."""
    path = home / "projects" / PROJECT / "episodes" / episode / "story.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    if story is None:
        story = sample_stories()[episode].read_text(encoding="utf-8")
    path.write_bytes(story.encode("utf-8") if isinstance(story, str) else story)
    if config is not None:
        write_config(home, config)
    return path


def create_pg_database(server_url: str, template: str | None = None) -> str:
    """A new database on the test server (optionally a copy of ``template``'s database)."""
    name = f"sb_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            if template is None:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            else:
                engine_for(template).dispose()  # TEMPLATE needs no open sessions on it
                source = sa.make_url(template).database
                conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
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


def _assets_of(defs: dg.Definitions) -> list[dg.AssetsDefinition | dg.AssetSpec | dg.SourceAsset]:
    """The assets a code location defines, as ``dg.materialize`` takes them."""
    kinds = (dg.AssetsDefinition, dg.AssetSpec, dg.SourceAsset)
    return [a for a in defs.assets or () if isinstance(a, kinds)]


@dataclass
class RunOutcome:
    """What one launch did, read back from the ledger (decisions) and the cost table."""

    result: dg.ExecuteInProcessResult
    decisions: dict[str, str]
    calls: dict[str, Counter[str]]

    @property
    def total_calls(self) -> int:
        return sum(sum(c.values()) for c in self.calls.values())

    def calls_of(self, step_id: str, kind: str | None = None) -> int:
        counter = self.calls.get(step_id, Counter())
        return sum(counter.values()) if kind is None else counter[kind]


@dataclass
class Env:
    """One pipeline home plus its ledger database."""

    root: Path
    db_url: str
    pg_server: str | None = None
    first: RunOutcome | None = field(default=None, repr=False)
    # Checkpoints published on object storage (PIPELINE_STORAGE_URL); the home is scratch.
    storage_url: str | None = None
    # The S3 server behind ``storage_url`` (a clone copies the bucket there).
    s3: Any = field(default=None, repr=False)
    # The DAGSTER_HOME of a test that runs the CLI against a Dagster instance of its own.
    dagster_home: Path | None = None

    @classmethod
    def sqlite(cls, root: Path) -> "Env":
        return cls(root, f"sqlite:///{root / 'ledger.sqlite3'}")

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def pipeline(self) -> PipelineResource:
        return PipelineResource(
            home=str(self.home), db_url=self.db_url, storage_url=self.storage_url
        )

    @property
    def ledger(self) -> LedgerStore:
        return ledger_for(self.db_url)

    @property
    def checkpoints(self) -> CheckpointStore:
        if self.storage_url is not None:
            return self.pipeline.checkpoints()
        return checkpoints_for(self.home)

    def key(self, step_id: str, episode: str = EPISODE_ID) -> StepKey:
        return StepKey(PROJECT, episode, step_id)

    def checkpoint(self, step_id: str, episode: str = EPISODE_ID) -> Checkpoint | None:
        return self.checkpoints.load(self.key(step_id, episode))

    def checkpoint_of(self, step_id: str, episode: str = EPISODE_ID) -> Checkpoint:
        """The step's published checkpoint, which the test expects to be there."""
        found = self.checkpoint(step_id, episode)
        assert found is not None, f"{step_id} has no published checkpoint"
        return found

    def checkpoint_path(self, step_id: str) -> Path:
        return self.checkpoints.path_for(self.key(step_id))

    def step_dir(self, step_id: str) -> Path:
        return self.checkpoints.step_dir(self.key(step_id))

    def row(self, step_id: str) -> LedgerRow | None:
        return self.ledger.get(self.key(step_id))

    def row_of(self, step_id: str) -> LedgerRow:
        """The step's ledger row, which the test expects to be there."""
        found = self.row(step_id)
        assert found is not None, f"{step_id} has no ledger row"
        return found

    def rows(self) -> dict[str, LedgerRow]:
        return {k.step_id: r for k, r in self.ledger.get_many(episodes=[EPISODE]).items()}

    def delete_rows(self) -> None:
        with self.ledger.engine.begin() as conn:
            conn.execute(sa.delete(step_run).where(step_run.c.project_id == PROJECT))

    def snapshot(self) -> dict[str, bytes]:
        """Every checkpoint and artifact of the episode as published (archives excluded):
        the files of its tree on a local home, the objects its rows' manifests name on a
        bucket (``<step>/checkpoint.json``, ``<step>/<artifact>``)."""
        if self.on_bucket:
            out = {}
            for step_id in STEP_IDS:
                manifest = self.manifest(step_id)
                if manifest is None:
                    continue
                named = {"checkpoint.json": manifest.envelope, **manifest.artifacts}
                for relative, ref in sorted(named.items()):
                    out[f"{step_id}/{relative}"] = self._bucket().storage.get(ref.key)
            return out
        base = self.checkpoints.root / PROJECT / EPISODE_ID
        return {
            str(p.relative_to(base)): p.read_bytes()
            for p in sorted(base.rglob("*"))
            if p.is_file() and "archive" not in p.parts
        }

    # ------------------------------------------------ accidents, on a disk or on a bucket
    @property
    def on_bucket(self) -> bool:
        return self.storage_url is not None

    def _bucket(self) -> ScratchCache:
        cache = scratch_cache_of(self.checkpoints)
        assert cache is not None, self.checkpoints
        return cache

    def manifest(self, step_id: str) -> Manifest | None:
        """The published manifest a step's row names (a bucket only)."""
        row = self.row(step_id)
        if row is None or row.checkpoint_pointer is None:
            return None
        return Manifest.decode(row.checkpoint_pointer)

    def _object_key(self, step_id: str, relative: str | None) -> str:
        manifest = self.manifest(step_id)
        assert manifest is not None, f"{step_id} has no published manifest"
        return (manifest.envelope if relative is None else manifest.artifacts[relative]).key

    def read_artifact(self, step_id: str, relative: str) -> bytes | None:
        """The bytes of a step's published artifact (None: gone): its file, or the object
        its row's manifest names."""
        if self.on_bucket:
            storage = self._bucket().storage
            key = self._object_key(step_id, relative)
            return storage.get(key) if storage.head(key) is not None else None
        path = self.step_dir(step_id) / relative
        return path.read_bytes() if path.is_file() else None

    def artifact_sha256(self, step_id: str, relative: str) -> str | None:
        data = self.read_artifact(step_id, relative)
        return None if data is None else hashlib.sha256(data).hexdigest()

    def lose_artifact(self, step_id: str, relative: str) -> None:
        """An artifact lost: its file deleted, or its object deleted from the bucket."""
        if self.on_bucket:
            self._bucket().storage.delete(self._object_key(step_id, relative))
        else:
            (self.step_dir(step_id) / relative).unlink()

    def replace_artifact(self, step_id: str, relative: str, data: bytes) -> None:
        """An artifact overwritten in place by other bytes (a hand edit, a tamper)."""
        if self.on_bucket:
            storage = self._bucket().storage
            key = self._object_key(step_id, relative)
            storage.delete(key)
            storage.put_create(key, data)
        else:
            (self.step_dir(step_id) / relative).write_bytes(data)

    def lose_checkpoint(self, step_id: str) -> None:
        """A checkpoint's envelope lost (its artifacts stay): the file, or the object."""
        if self.on_bucket:
            self._bucket().storage.delete(self._object_key(step_id, None))
        else:
            self.checkpoint_path(step_id).unlink()

    def edit_envelope(self, step_id: str, edit: Any) -> dict[str, Any]:
        """An operator's hand edit of a published envelope, ``edit(raw)`` changing its JSON:
        the file written over on a local home; on a bucket the object downloaded, edited and
        put back under its key (what ``storyboard accept`` then reads). Returns the edited
        JSON."""
        if self.on_bucket:
            storage = self._bucket().storage
            key = self._object_key(step_id, None)
            raw = json.loads(storage.get(key))
            edit(raw)
            storage.delete(key)
            storage.put_create(key, json.dumps(raw).encode("utf-8"))
            return dict(raw)
        path = self.checkpoint_path(step_id)
        raw = json.loads(path.read_text(encoding="utf-8"))
        edit(raw)
        path.write_text(json.dumps(raw), encoding="utf-8")
        return dict(raw)

    def stored(self) -> dict[str, Any]:
        """What the home and the bucket hold (the ledger apart): every file of the home
        but a process's scratch copies, and every object of the bucket by key, size and
        e_tag. Equal before and after: not one byte written."""
        files = {}
        for path in sorted(self.home.rglob("*")):
            relative = path.relative_to(self.home)
            if SCRATCH_DIR in relative.parts or not path.is_file():
                continue
            files[relative.as_posix()] = (path.read_bytes(), path.stat().st_mtime_ns)
        objects = {}
        if self.on_bucket:
            for meta in self._bucket().storage.list(""):
                objects[meta.key] = (meta.size, meta.e_tag)
        return {"files": files, "objects": objects}

    def force_cleared(self, step_id: str) -> bool:
        """Whether a force left its mark on the step: on a local home the marker file in its
        cleared folder; on a bucket nothing is deleted or written, the stale row without a
        manifest is the whole record."""
        if self.on_bucket:
            return self.manifest(step_id) is None
        return (self.step_dir(step_id) / FORCE_MARKER).exists()

    def step_judge(self, step_id: str) -> StepJudge:
        return StepJudge(
            STEPS[step_id],
            graph=StepGraph(STEPS.values()),
            settings=self.pipeline.settings(),
            ledger=self.ledger,
            checkpoints=self.checkpoints,
        )

    def runtime(
        self,
        step_id: str,
        *,
        text_model: TextModel | None = None,
        image_model: ImageModel | None = None,
    ) -> StepRunner:
        resources = build_resources(self.pipeline)
        return StepRunner(
            self.step_judge(step_id),
            ledger=self.ledger,
            checkpoints=self.checkpoints,
            models={
                "text": text_model or cast(TextModel, resources["text_model"]),
                "image": image_model or cast(ImageModel, resources["image_model"]),
            },
        )

    def judge(self, step_id: str, mode: LaunchMode = LaunchMode.RESUME) -> ResumeDecision:
        key = self.key(step_id)
        return self.step_judge(step_id).judge(key, mode=mode, row=self.ledger.get(key)).decision

    def run_direct(
        self,
        step_ids: Iterable[str] = STEP_IDS,
        *,
        mode: LaunchMode = LaunchMode.RESUME,
        text_model: TextModel | None = None,
        image_model: ImageModel | None = None,
        episode: str = EPISODE_ID,
    ) -> dict[str, StepOutcome]:
        """The run protocol without Dagster (same judge, claim and publish)."""
        outcomes = {}
        run = RunInfo(f"direct-{uuid.uuid4().hex[:8]}:0", mode, "api")
        for step_id in step_ids:
            runtime = self.runtime(step_id, text_model=text_model, image_model=image_model)
            inputs = {dep: self.checkpoint(dep, episode) for dep in STEPS[step_id].deps}
            partition = Episode(PROJECT, episode).partition_key
            outcomes[step_id] = runtime.run(partition, run, inputs)
        return outcomes

    def materialize(
        self,
        selection: Iterable[str] | None = None,
        *,
        tags: Mapping[str, str] | None = None,
        text_model: TextModel | None = None,
        image_model: ImageModel | None = None,
        raise_on_error: bool = True,
        defs: dg.Definitions | None = None,
    ) -> RunOutcome:
        """A real Dagster launch of the (selected) assets for the test partition: the
        storyboard's, or those of ``defs`` (a code location built with other steps)."""
        resources = build_resources(self.pipeline)
        if text_model is not None:
            resources["text_model"] = text_model
        if image_model is not None:
            resources["image_model"] = image_model
        ledger = self.ledger
        seq = ledger.cursor()[0]
        last_call = max((c["id"] for c in ledger.provider_calls(episode=EPISODE)), default=0)
        dagster_dir = scratch_dir("dagster")
        try:
            with dg.instance_for_test(
                temp_dir=str(dagster_dir), overrides=FAST_EVENT_LOG
            ) as instance:
                instance.add_dynamic_partitions("episodes", [PARTITION])
                result = dg.materialize(
                    ASSETS if defs is None else _assets_of(defs),
                    selection=list(selection) if selection is not None else None,
                    partition_key=PARTITION,
                    instance=instance,
                    resources=resources,
                    tags=dict(tags or {}),
                    raise_on_error=raise_on_error,
                )
        finally:
            shutil.rmtree(dagster_dir, ignore_errors=True)
        decisions: dict[str, str] = {}
        for row in ledger.transitions(since_seq=seq):
            if row.episode_id == EPISODE_ID and row.action in DECISION_ACTIONS:
                decisions.setdefault(row.step_id, str(row.action))
        calls: dict[str, Counter[str]] = {}
        for call in ledger.provider_calls(episode=EPISODE):
            if call["id"] > last_call:
                calls.setdefault(call["step_id"], Counter())[call["kind"]] += 1
        return RunOutcome(result, decisions, calls)

    def clone(self) -> "Env":
        """An independent copy: files copied, database copied (file or PG template), the
        bucket copied object by object into a new one (same keys: the manifests in the
        copied rows name them), the scratch left behind as a new process would."""
        root = scratch_dir("clone")
        shutil.copytree(self.home, root / "home", ignore=shutil.ignore_patterns(SCRATCH_DIR))
        if self.pg_server is None:
            engine_for(self.db_url).dispose()
            for suffix in ("", "-wal", "-shm"):
                source = self.root / f"ledger.sqlite3{suffix}"
                if source.exists():
                    shutil.copy2(source, root / source.name)
            copy = Env.sqlite(root)
        else:
            copy = Env(root, create_pg_database(self.pg_server, self.db_url), self.pg_server)
        if self.storage_url is not None:
            copy.storage_url, copy.s3 = copy_bucket(self.s3, self.storage_url), self.s3
        return copy

    def destroy(self) -> None:
        if self.pg_server is not None:
            drop_pg_database(self.pg_server, self.db_url)
        else:
            engine_for(self.db_url).dispose()
        shutil.rmtree(self.root, ignore_errors=True)


def copy_bucket(s3: Any, storage_url: str) -> str:
    """Every object of ``storage_url``'s bucket copied into a new bucket of the same server;
    the storage URL of the copy (same prefix)."""
    source, _, prefix = storage_url.removeprefix("s3://").partition("/")
    target = s3.new_bucket()
    client = s3.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=source):
        for item in page.get("Contents", []):
            client.copy_object(
                Bucket=target, Key=item["Key"], CopySource={"Bucket": source, "Key": item["Key"]}
            )
    return f"s3://{target}/{prefix}"


@contextlib.contextmanager
def built_episode(name: str, pg_server_url: str | None = None, s3: Any = None) -> Iterator[Env]:
    """A home where the sample episode ran end to end (SQLite, or a fresh PostgreSQL
    database on ``pg_server_url``; its checkpoints on a new bucket of ``s3``, a running S3
    server, when given): the template fixtures clone per test. ``first``: that run."""
    if pg_server_url is None:
        env = Env.sqlite(scratch_dir(name))
    else:
        env = Env(scratch_dir(f"{name}-pg"), create_pg_database(pg_server_url), pg_server_url)
    if s3 is not None:
        env.storage_url, env.s3 = f"s3://{s3.new_bucket()}/storyboard", s3
    try:
        write_episode(env.home)
        env.first = env.materialize()
        yield env
    finally:
        env.destroy()


@contextlib.contextmanager
def cloned(template: Env) -> Iterator[Env]:
    env = template.clone()
    try:
        yield env
    finally:
        env.destroy()


def step_failure_messages(result: Any) -> dict[str, str]:
    """step key → the failure text Dagster recorded for it."""
    out = {}
    for event in result.all_events:
        if event.is_step_failure:
            data = event.event_specific_data
            failure = getattr(data, "user_failure_data", None)
            text = failure.description if failure is not None else None
            out[event.step_key] = text or data.error.to_string()
    return out
