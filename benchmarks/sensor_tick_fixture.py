"""The pieces of ``benchmarks/sensor_tick.py``: the ten stand-in steps (``STEPS``), the
generated tree and ledger rows, the floor (a bare ``lstat`` walk) and the 1 % change.
"""

import hashlib
import io
import os
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run on its own too (tests/core runs every file)
    sys.path.insert(0, str(ROOT))


from pipeline_defs.project import ProjectConfig, scoped_fingerprints  # noqa: E402
from pipeline_defs.resume.clock import format_timestamp  # noqa: E402
from pipeline_defs.resume.completion import CompletionReport, Origin  # noqa: E402
from pipeline_defs.resume.decision_types import config_hash  # noqa: E402
from pipeline_defs.resume.errors import PipelineError  # noqa: E402
from pipeline_defs.resume.partition import StepKey  # noqa: E402
from pipeline_defs.resume.settings import ResumeSettings  # noqa: E402
from pipeline_defs.resume.status import StepStatus  # noqa: E402
from pipeline_defs.steps.context import StepContext  # noqa: E402
from pipeline_defs.steps.graph import StepGraph  # noqa: E402
from pipeline_defs.steps.judge import StepJudge  # noqa: E402
from pipeline_defs.steps.spec import Step  # noqa: E402
from resources.checkpoints.envelope import Artifact, Checkpoint, mask_secrets  # noqa: E402
from resources.checkpoints.seal import Seal, SealedEntry  # noqa: E402
from resources.checkpoints.store import CheckpointStore  # noqa: E402
from resources.ledger.store import LedgerStore  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8  # 2 KiB stand-in image


class BenchStep(Step):
    """A trivial step: data ``{"items": [...]}``; verify checks the item count."""

    image: str | None = None

    def validate_data(self, data: Mapping[str, Any], *, source: str) -> None:
        if not isinstance(data.get("items"), list):
            raise PipelineError("io.integrity_violation", f"{source}: items missing")

    def verify_completion(self, ctx: StepContext, checkpoint: Checkpoint) -> CompletionReport:
        items = checkpoint.data.get("items") or []
        if len(items) != checkpoint.data.get("count"):
            return CompletionReport.incomplete(Origin.INVARIANT_DRIFT, ("item count",))
        return CompletionReport.clean()


def _step(step_id: str, deps: tuple[str, ...], image: str | None = None, **extra: Any) -> Step:
    cls = type(
        step_id.title().replace("_", ""),
        (BenchStep,),
        {
            "step_id": step_id,
            "deps": deps,
            "image": image,
            "__module__": __name__,
            **extra,
        },
    )
    globals()[cls.__name__] = cls
    made: Step = cls()
    return made


STEPS: tuple[Step, ...] = (
    _step("story_source", ()),
    _step("entity_canon", ("story_source",)),
    _step("world_guide", ("story_source", "entity_canon")),
    _step(
        "scene_detail",
        ("story_source", "entity_canon", "world_guide"),
        resume_config_keys=("scenes.shots_per_scene",),
    ),
    _step("entity_t2i", ("entity_canon",), allow_auto_rerun_on_schema_bump=True),
    _step("shot_dependency_t2i", ("scene_detail",)),
    _step("t2i_review", ("scene_detail", "entity_t2i"), modifies_checkpoints=("scene_detail",)),
    _step("ref_image_gen", ("entity_canon", "entity_t2i", "t2i_review"), image="refs/C01.png"),
    _step("composite_image_gen", ("ref_image_gen",), image="C01_O01.png"),
    _step(
        "scene_image_pipeline",
        ("scene_detail", "shot_dependency_t2i", "composite_image_gen", "t2i_review"),
        image="shots/S01.png",
    ),
)


# ----------------------------------------------------------------------------- generation
TEMPLATE = "e00000"  # the episode generated the slow, real way; every other one is a copy


def _template(home: Path, ledger: LedgerStore, ts: str) -> dict[str, tuple[bytes, Seal]]:
    """Episode ``bench/e00000`` built the real way: ``Checkpoint`` envelopes, PNGs, the input
    file, and each row's seal from ``CheckpointStore.seal`` with the run protocol's
    ``verifier_reads``. Per step: the envelope bytes and the decoded seal.

    Nothing in an envelope but ``episode_id``, ``run_id`` and the timestamps names the
    episode (``content_hash`` covers schema, status, data and artifacts only), so the
    copies are valid envelopes of their own episodes."""
    config = ProjectConfig().as_dict()
    masked = mask_secrets(config)
    png_sha256 = hashlib.sha256(PNG).hexdigest()
    project, episode = "bench", TEMPLATE
    inputs = home / "projects" / project / "episodes" / episode
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / "story.md").write_text("# episode\n\nOnce upon a time.\n")
    for step in STEPS:
        assert isinstance(step, BenchStep)
        folder = home / "checkpoints" / project / episode / step.step_id
        artifacts: tuple[Artifact, ...] = ()
        if step.image:
            target = folder / step.image
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(PNG)
            artifacts = (Artifact(step.image, png_sha256, len(PNG)),)
        else:
            folder.mkdir(parents=True, exist_ok=True)
        fingerprints = scoped_fingerprints(config, step.resume_config_keys)
        run_id = f"gen-{episode}-{step.step_id}:0"
        checkpoint = Checkpoint(
            step_id=step.step_id,
            project_id=project,
            episode_id=episode,
            status=StepStatus.COMPLETED,
            schema_version=step.schema_version,
            config_hash=config_hash(fingerprints),
            resume_config_keys=tuple(step.resume_config_keys),
            config_fingerprints=fingerprints,
            project_config_snapshot=masked,
            data={"items": [f"{step.step_id}-{i}" for i in range(3)], "count": 3},
            artifacts=artifacts,
            produced_by={"run_id": run_id, "started_at": ts},
            created_at=ts,
        )
        (folder / "checkpoint.json").write_text(checkpoint.to_json(), encoding="utf-8")
    time.sleep(0.05)  # settled: not racily clean when sealed
    store = CheckpointStore(home)
    graph = StepGraph(STEPS)
    out: dict[str, tuple[bytes, Seal]] = {}
    for step in STEPS:
        runtime = StepJudge(
            step,
            graph=graph,
            settings=ResumeSettings(home=home),
            ledger=ledger,
            checkpoints=store,
        )
        key = StepKey(project, episode, step.step_id)
        loaded = store.load(key)
        assert loaded is not None
        reads = runtime.verifier_reads(runtime.context(key))
        text = store.seal(loaded, reads, revision=step.verify_revision)
        seal = Seal.decode(text)
        assert seal is not None, key
        out[step.step_id] = (store.path_for(key).read_bytes(), seal)
    return out


def _copy_seal(
    template: Seal,
    home: str,
    episode: str,
    version: str,
    sealed_ns: int,
    checkpoint: tuple[int, int, int],
) -> str:
    """The template's seal for ``episode``: same summary, its own paths and stat identities."""

    def entries(files: tuple[SealedEntry, ...]) -> tuple[SealedEntry, ...]:
        out = []
        for path, *_rest in files:
            mine = path.replace(f"/{TEMPLATE}/", f"/{episode}/").replace(
                f"/{TEMPLATE}", f"/{episode}"
            )
            st = os.lstat(f"{home}/{mine}")
            out.append((mine, st.st_mtime_ns, st.st_size, st.st_ino, None))
        return tuple(out)

    return replace(
        template,
        checkpoint=checkpoint,
        version=version,
        files=entries(template.files),
        reads=entries(template.reads),
        sealed_ns=sealed_ns,
    ).encode()


def generate(home: Path, ledger: LedgerStore, episodes: int) -> list[str]:
    """Completed, sealed rows and valid envelopes (+ PNGs) for every (episode, step).

    Fast: one episode is built the real way (:func:`_template`), every other one is a
    byte copy with its own ids and timestamps, sealed with its own stat identities, and
    the rows go in with one ``COPY``."""
    base = datetime.now(UTC) - timedelta(hours=1)
    keys = [f"bench/e{n:05d}" for n in range(episodes)]
    stamps = [format_timestamp(base - timedelta(seconds=60 * n)) for n in range(episodes)]
    template = _template(home, ledger, stamps[0])
    story = (home / "projects/bench/episodes" / TEMPLATE / "story.md").read_bytes()
    root = str(home)
    for n, pk in enumerate(keys[1:], start=1):
        episode = pk.split("/")[1]
        inputs = f"{root}/projects/bench/episodes/{episode}"
        os.makedirs(inputs)
        with open(f"{inputs}/story.md", "wb") as handle:
            handle.write(story)
        for step in STEPS:
            assert isinstance(step, BenchStep)
            folder = f"{root}/checkpoints/bench/{episode}/{step.step_id}"
            if step.image and "/" in step.image:
                os.makedirs(f"{folder}/{step.image.rsplit('/', 1)[0]}")
            else:
                os.makedirs(folder)
            if step.image:
                with open(f"{folder}/{step.image}", "wb") as handle:
                    handle.write(PNG)
            envelope = template[step.step_id][0]
            envelope = envelope.replace(TEMPLATE.encode(), episode.encode()).replace(
                stamps[0].encode(), stamps[n].encode()
            )
            with open(f"{folder}/checkpoint.json", "wb") as handle:
                handle.write(envelope)
    time.sleep(0.05)  # every file settled before sealing (not racily clean)
    sealed_ns = time.time_ns()
    buffer = io.StringIO()
    for n, pk in enumerate(keys):
        episode = pk.split("/")[1]
        ts = stamps[n]
        for step in STEPS:
            run_id = f"gen-{episode}-{step.step_id}:0"
            seal = template[step.step_id][1]
            if n:
                st = os.lstat(f"{root}/checkpoints/bench/{episode}/{step.step_id}/checkpoint.json")
                identity = (st.st_mtime_ns, st.st_size, st.st_ino)
                text = _copy_seal(seal, root, episode, f"{ts}|{run_id}|0", sealed_ns, identity)
            else:
                text = seal.encode()
            fields = [str(uuid.uuid4()), "bench", episode, step.step_id, "completed", run_id]
            fields += [ts, ts, ts, ts, "0", text]
            buffer.write("\t".join(f.replace("\\", "\\\\") for f in fields) + "\n")
    # Synthetic bulk load (the benchmark's own SQL), on psycopg's own connection.
    raw: Any = ledger.engine.raw_connection()
    try:
        with raw.cursor() as cur:
            columns = (
                "id, project_id, episode_id, step_id, status, run_id, started_at, "
                "completed_at, created_at, updated_at, recovery_count, checkpoint_seal"
            )
            with cur.copy(f"COPY step_run ({columns}) FROM STDIN") as copy:
                copy.write(buffer.getvalue())
        raw.commit()
        with raw.cursor() as cur:
            # What autovacuum does within a minute of a bulk load: without statistics the
            # planner takes a tiny table and scans where a real ledger uses its indexes.
            cur.execute("ANALYZE step_run")
        raw.commit()
    finally:
        raw.close()
    return keys


# ----------------------------------------------------------------------------- the floor
def floor_walk(home: Path) -> tuple[float, float, int]:
    """(wall s, CPU s, entries): ``lstat`` of every entry of the generated tree (checkpoints
    and inputs), walked with ``scandir``: the physical floor of noticing any change by stat."""
    lstat, scandir = os.lstat, os.scandir
    t0, c0 = time.perf_counter(), time.process_time()
    count = 0
    pending = [f"{home}/checkpoints", f"{home}/projects"]
    while pending:
        directory = pending.pop()
        with scandir(directory) as entries:
            for entry in entries:
                lstat(entry.path)
                count += 1
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
    return time.perf_counter() - t0, time.process_time() - c0, count


def change_one_percent(home: Path, ledger: LedgerStore, keys: list[str]) -> int:
    """Half of 1 % lose a PNG (disk), half get a failed ledger row (ledger ops)."""
    chosen = keys[::100] or keys[:1]
    for n, pk in enumerate(chosen):
        project, episode = pk.split("/")
        if n % 2 == 0:
            (
                home
                / "checkpoints"
                / project
                / episode
                / "scene_image_pipeline"
                / "shots"
                / "S01.png"
            ).unlink()
        else:
            key = StepKey(project, episode, "composite_image_gen")
            assert ledger.claim(key, "bench-fail:0")
            assert ledger.transition(key, "bench-fail:0", "failed")
    return len(chosen)
