"""The pieces of ``benchmarks/object_store.py``: the tick part's fixture (one episode run
for real, replicated), the request ``Recording``, the simulated ``Clock`` and the
changes other machines make.
"""

import dataclasses
import hashlib
import shutil
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run on its own too (tests/core runs every file)
    sys.path.insert(0, str(ROOT))
SUPPORT = str(ROOT / "tests" / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

import sqlalchemy as sa  # noqa: E402
from s3_server import S3Server  # noqa: E402
from storyboard_support import Env, scratch_dir, write_episode  # noqa: E402

from pipeline_defs.resume.partition import StepKey  # noqa: E402
from pipeline_defs.storyboard import STORYBOARD_STEPS  # noqa: E402
from resources.checkpoints.bucket import sha256_bytes  # noqa: E402
from resources.checkpoints.manifest import ENVELOPE_NAME, Manifest, ObjectRef  # noqa: E402
from resources.checkpoints.object_seal import ObjectSeal  # noqa: E402
from resources.checkpoints.published import published_checkpoints, scratch_cache_of  # noqa: E402
from resources.ledger.store import LedgerStore  # noqa: E402
from resources.ledger.tables import step_run  # noqa: E402
from resources.pipeline import LedgerPointers, PipelineResource  # noqa: E402
from resources.storage import ObjectMeta, Storage, open_storage  # noqa: E402

# ----------------------------------------------------------------------------- sensor ticks
PROJECT = "demo"
TEMPLATE = "ep01"  # the episode run for real (the sample story); the others are replicas
PREFIX = "sb"
BUDGET = 3600.0  # the cold tick measured whole, not split by the tick budget
FULL_REFRESH = 600.0  # build_resume_sensor's default
PNG_STEP = "ref_image_gen"  # a picture of it is deleted from the bucket
FAILED_STEP = "composite_image_gen"  # its row turns failed
STORY_STEP = "story_source"  # an edited story blocks it
KINDS = ("get", "head", "list", "put_create", "put_if_match", "delete")
SCRUB_MODULE = "pipeline_defs/judging/scrub.py"
T = TypeVar("T")


class Recording:
    """The real storage, its requests counted by kind: the scrub's apart from everything
    else, whose call sites are kept (instrumentation around the storage, not a stand-in).
    A LIST counts once per call (one page up to 1,000 keys: an episode holds ~26)."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.counts: Counter[tuple[str, str]] = Counter()  # (scrub|other, kind)
        self.sites: Counter[str] = Counter()  # "kind  site <- caller <- caller", not scrub
        self.seconds: dict[str, float] = {}  # time spent in requests, per share

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def is_local(self) -> bool:
        return self.inner.is_local

    def reset(self) -> None:
        self.counts.clear()
        self.sites.clear()
        self.seconds.clear()

    def share(self, which: str) -> dict[str, int]:
        return {k: n for (w, k), n in sorted(self.counts.items()) if w == which and n}

    def _note(self, kind: str) -> str:
        stack = traceback.StackSummary.extract(
            traceback.walk_stack(None), limit=60, lookup_lines=False
        )
        if any(frame.filename.endswith(SCRUB_MODULE) for frame in stack):
            self.counts[("scrub", kind)] += 1
            return "scrub"
        self.counts[("other", kind)] += 1
        product = [
            f"{Path(f.filename).relative_to(ROOT)}:{f.lineno} {f.name}"
            for f in stack
            if f.filename.startswith(str(ROOT))
            and "/benchmarks/" not in f.filename
            and "/resources/storage/" not in f.filename
            and "/.venv/" not in f.filename
        ]
        self.sites[f"{kind:5s} " + " <- ".join(product[:3])] += 1
        return "other"

    def _timed(self, share: str, call: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return call()
        finally:
            self.seconds[share] = self.seconds.get(share, 0.0) + time.perf_counter() - started

    def get(self, key: str) -> bytes:
        return self._timed(self._note("get"), lambda: self.inner.get(key))

    def head(self, key: str) -> ObjectMeta | None:
        return self._timed(self._note("head"), lambda: self.inner.head(key))

    def put_create(self, key: str, data: bytes) -> ObjectMeta:
        return self._timed(self._note("put_create"), lambda: self.inner.put_create(key, data))

    def put_if_match(self, key: str, data: bytes, expected: ObjectMeta) -> ObjectMeta:
        share = self._note("put_if_match")
        return self._timed(share, lambda: self.inner.put_if_match(key, data, expected))

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        share = self._note("list")
        # The pages are fetched as the caller iterates: all of them, timed.
        return iter(self._timed(share, lambda: list(self.inner.list(prefix))))

    def delete(self, key: str) -> None:
        self._timed(self._note("delete"), lambda: self.inner.delete(key))


def _moto_backend() -> Any:
    """moto's in-process S3 backend (the server runs in this process): the fixture is
    loaded into it directly, 60x faster than puts over HTTP (~300/s on this host)."""
    from moto.core import DEFAULT_ACCOUNT_ID  # type: ignore[attr-defined]
    from moto.s3.models import s3_backends

    return s3_backends[DEFAULT_ACCOUNT_ID]["aws"]


def _story_key(episode: str) -> str:
    return f"projects/{PROJECT}/episodes/{episode}/story.md"


def replicate(
    storage: Storage, ledger: LedgerStore, bucket: str, episodes: int
) -> tuple[list[str], int]:
    """Copy the template episode to ``episodes - 1`` others: objects, story, ledger rows.

    Returns the partition keys (template included) and the objects per episode."""
    backend = _moto_backend()
    source = f"checkpoints/{PROJECT}/{TEMPLATE}/"
    objects = {m.key: storage.get(m.key) for m in storage.list(source.rstrip("/"))}
    digests = {key: sha256_bytes(data) for key, data in objects.items()}
    story = storage.get(_story_key(TEMPLATE))
    with ledger.engine.connect() as conn:
        template = [
            dict(r._mapping)
            for r in conn.execute(
                sa.select(step_run).where(
                    step_run.c.project_id == PROJECT, step_run.c.episode_id == TEMPLATE
                )
            )
        ]
    assert len(template) == len(STORYBOARD_STEPS), [r["step_id"] for r in template]
    seals = {r["step_id"]: ObjectSeal.decode(r["checkpoint_seal"]) for r in template}
    unsealed = sorted(s for s, seal in seals.items() if seal is None)
    assert not unsealed, f"template rows without an object seal: {unsealed}"
    field = b'\n "episode_id": "%s",' % TEMPLATE.encode()
    rows: list[dict[str, Any]] = []
    names = [f"e{n:04d}" for n in range(1, episodes)]
    for episode in names:
        prefix = f"checkpoints/{PROJECT}/{episode}/"
        refs: dict[str, ObjectRef] = {}
        for key, data in objects.items():
            digest = digests[key]
            if key.endswith("/" + ENVELOPE_NAME):  # its episode_id (not in the content hash)
                assert data.count(field) == 1, key
                data = data.replace(field, b'\n "episode_id": "%s",' % episode.encode())
                digest = sha256_bytes(data)
            moved = prefix + key[len(source) :]
            put = backend.put_object(bucket, f"{PREFIX}/{moved}", data)
            refs[key] = ObjectRef(moved, len(data), digest, put.etag, None)
        story_tag = backend.put_object(bucket, f"{PREFIX}/{_story_key(episode)}", story).etag
        pointers: dict[str, str] = {}
        for row in template:
            m = Manifest.decode(row["checkpoint_pointer"])
            pointers[row["step_id"]] = Manifest(
                StepKey(PROJECT, episode, m.step.step_id),
                m.attempt,
                refs[m.envelope.key],
                m.content_hash,
                {path: refs[ref.key] for path, ref in m.artifacts.items()},
            ).encode()
        for row in template:
            seal = seals[row["step_id"]]
            assert seal is not None
            inputs = {}
            for key, tag in seal.inputs.items():
                if key == _story_key(TEMPLATE):
                    inputs[_story_key(episode)] = story_tag
                else:
                    assert f"/episodes/{TEMPLATE}/" not in key, key
                    inputs[key] = tag
            victims = {
                step: hashlib.sha256(pointers[step].encode("utf-8")).hexdigest()
                for step in seal.victims
            }
            rows.append(
                {
                    **row,
                    "id": str(uuid.uuid4()),
                    "episode_id": episode,
                    "checkpoint_pointer": pointers[row["step_id"]],
                    "checkpoint_seal": dataclasses.replace(
                        seal, inputs=inputs, victims=victims
                    ).encode(),
                }
            )
    with ledger.engine.begin() as conn:  # synthetic bulk load (the benchmark's own insert)
        for start in range(0, len(rows), 2000):
            conn.execute(sa.insert(step_run), rows[start : start + 2000])
    if ledger.engine.dialect.name == "postgresql":
        with ledger.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE step_run")  # what autovacuum does after a load
    partitions = sorted(f"{PROJECT}/{e}" for e in [TEMPLATE, *names])
    return partitions, len(objects)


@dataclasses.dataclass
class Clock:
    """The sensor's simulated time: ``interval`` seconds between ticks."""

    mono: float
    wall: datetime

    def monotonic(self) -> float:
        return self.mono

    def now(self) -> datetime:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)


def choose_changes(partitions: list[str]) -> dict[str, str]:
    """1 % of the partitions (at least 6), spread evenly: half lose a PNG in the bucket;
    the others: failed ledger rows, one story replaced as ``add-episode --replace`` does,
    one story overwritten in the bucket behind the ledger's back."""
    n = len(partitions)
    count = min(n, max(6, round(n / 100)))
    chosen = [partitions[min(n - 1, int((i + 0.5) * n / count))] for i in range(count)]
    others = ["failed", "story_replaced", "story_overwritten"]
    others += ["failed"] * count
    out: dict[str, str] = {}
    for i, pk in enumerate(chosen):
        out[pk] = "png_deleted" if i % 2 == 0 else others.pop(0)
    return out


def apply_changes(changes: dict[str, str], pipeline: PipelineResource, home: Path) -> None:
    """What other machines do: a storage, a store and a scratch of their own."""
    ledger = pipeline.ledger()
    storage_url = pipeline.storage_url
    assert storage_url is not None
    storage = open_storage(storage_url, home=home)
    writer = published_checkpoints(home, storage, LedgerPointers(ledger))
    for pk, kind in changes.items():
        project, episode = pk.split("/")
        if kind == "png_deleted":
            row = ledger.get(StepKey(project, episode, PNG_STEP))
            assert row is not None and row.checkpoint_pointer is not None
            refs = Manifest.decode(row.checkpoint_pointer).artifacts
            storage.delete(refs[sorted(refs)[0]].key)
        elif kind == "failed":
            step = StepKey(project, episode, FAILED_STEP)
            assert ledger.claim(step, "bench-fail:0")
            assert ledger.transition(step, "bench-fail:0", "failed")
        elif kind == "story_replaced":  # pipeline_defs/operations/episodes.py add_episode
            writer.sync_inputs(project, episode)
            story = home / _story_key(episode)
            story.write_bytes(story.read_bytes() + b"\nA new scene.\n")
            assert writer.publish_inputs(project, episode)
            ledger.clear_episode_seals(project, episode)
        else:  # story_overwritten: a put of its own, the ledger not told
            key = _story_key(episode)
            found = storage.head(key)
            assert found is not None
            storage.put_if_match(key, storage.get(key) + b"\nEdited in the bucket.\n", found)


def build_fixture(server: S3Server, db_url: str, episodes: int) -> dict[str, Any]:
    """One episode run for real on a fresh bucket, then replicated."""
    bucket = server.new_bucket()
    writer = Env(scratch_dir("bench-os-writer"), db_url)
    writer.storage_url = f"s3://{bucket}/{PREFIX}"
    try:
        write_episode(writer.home)
        store = writer.checkpoints
        cache = scratch_cache_of(store)
        assert cache is not None
        store.publish_inputs(PROJECT, TEMPLATE)  # inputs first: every row gets an object seal
        started = time.perf_counter()
        outcome = writer.materialize()
        assert outcome.result.success
        ran = time.perf_counter() - started
        started = time.perf_counter()
        partitions, objects = replicate(cache.storage, writer.ledger, bucket, episodes)
        return {
            "db_url": db_url,
            "storage_url": writer.storage_url,
            "partitions": partitions,
            "objects_per_episode": objects,
            "run_seconds": round(ran, 1),
            "replicate_seconds": round(time.perf_counter() - started, 1),
        }
    finally:
        shutil.rmtree(writer.root, ignore_errors=True)
