"""Publishing a checkpoint on object storage against raw puts of the same bytes.

What a bucket-backed image step does to publish (resources/checkpoints/bucket.py): its
objects go under its own attempt prefix as create-only puts (``If-None-Match: *``), the
envelope last, and one owner-aware ledger transition stores the manifest as the commit
pointer. The baseline is the least any writer can do: plain puts of the same bytes
(overwrite mode, no condition, no hashing, no ledger). Both run in the same process, in
alternation, against the same moto S3 server on 127.0.0.1, so the ratio holds on any
machine even where absolute times do not. Target: ours <= 1.3 x the raw puts, ledger commit
included.

It also measures the scrub: one LIST per episode prefix compared with the manifests, the
request that replaces per-file checks on a bucket (``scrub_episode``).

    .venv/bin/python benchmarks/object_store.py --rounds 30 \
        [--db-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

The ledger database is the URL given (a throwaway table set is created in it through the
store's migrations) or a temporary SQLite file.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/object_store.py` from anywhere
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import obstore  # noqa: E402
from s3_server import SECRET, running_s3_server  # noqa: E402

from pipeline_defs.resume.partition import StepKey  # noqa: E402
from resources.checkpoints.bucket import BucketCheckpoints, sha256_bytes  # noqa: E402
from resources.checkpoints.envelope import Artifact, Checkpoint  # noqa: E402
from resources.ledger.store import LedgerStore  # noqa: E402
from resources.storage import ObjectStorage, open_storage  # noqa: E402

PICTURES = 8  # an image step of the demo: 4-8 PNGs, each with a receipt
PICTURE_BYTES = 40_000  # a 384 x 256 offline-model PNG is 20-60 KB
TARGET = 1.3


def image_step_payload(n: int) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for i in range(PICTURES):
        out[f"refs/C{i:02d}.png"] = os.urandom(PICTURE_BYTES)
        out[f"refs/C{i:02d}.png.receipt.json"] = (b'{"seed": "%d-%d"}' % (n, i)) * 4
    return out


def checkpoint_for(key: StepKey, run_id: str, objects: dict[str, bytes]) -> Checkpoint:
    return Checkpoint(
        step_id=key.step_id,
        project_id=key.project_id,
        episode_id=key.episode_id,
        status="completed",
        schema_version=1,
        config_hash="c",
        resume_config_keys=(),
        config_fingerprints={},
        project_config_snapshot={},
        data={"images": {p: {"path": p} for p in objects if p.endswith(".png")}},
        artifacts=tuple(
            Artifact(path=p, sha256=sha256_bytes(b), bytes=len(b))
            for p, b in sorted(objects.items())
        ),
        produced_by={"run_id": run_id},
        created_at=run_id,
    )


def ours(store: BucketCheckpoints, ledger: LedgerStore, key: StepKey, n: int) -> float:
    run_id = f"bench-{n}-{uuid.uuid4().hex[:8]}:0"
    objects = image_step_payload(n)
    cp = checkpoint_for(key, run_id, objects)
    start = time.perf_counter()
    assert ledger.claim(key, run_id)
    row = ledger.get(key)
    assert row is not None and row.started_at is not None
    attempt = store.attempt(key, run_id, row.started_at)
    for path, data in objects.items():
        attempt.put(path, data)
    manifest = attempt.publishable(cp)
    assert ledger.transition(key, run_id, "completed", pointer=manifest.encode())
    return time.perf_counter() - start


def raw(raw_store: obstore.store.S3Store, key: StepKey, n: int) -> float:
    objects = image_step_payload(n)
    envelope = checkpoint_for(key, f"raw-{n}", objects).to_json().encode()
    start = time.perf_counter()
    base = f"raw/{key.project_id}/{key.episode_id}/{key.step_id}"
    for path, data in objects.items():
        obstore.put(raw_store, f"{base}/{path}", data)
    obstore.put(raw_store, f"{base}/checkpoint.json", envelope)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--episodes", type=int, default=200, help="episodes for the scrub")
    parser.add_argument("--db-url", default=None)
    args = parser.parse_args()
    with running_s3_server() as server, tempfile.TemporaryDirectory() as scratch:
        for name, value in server.env(SECRET).items():
            os.environ[name] = value
        bucket = server.new_bucket()
        storage = open_storage(f"s3://{bucket}/bench", home=Path(scratch))
        assert isinstance(storage, ObjectStorage)
        raw_store = obstore.store.S3Store(
            bucket, endpoint=server.endpoint, client_options={"allow_http": True}
        )
        db_url = args.db_url or f"sqlite:///{scratch}/ledger.sqlite3"
        ledger = LedgerStore(db_url)
        ledger.migrate()
        store = BucketCheckpoints(storage)
        project = f"bench{uuid.uuid4().hex[:6]}"
        ours_s: list[float] = []
        raw_s: list[float] = []
        for n in range(args.rounds):  # alternate: the same load on both
            key = StepKey(project, f"ep{n}", "ref_image_gen")
            raw_s.append(raw(raw_store, key, n))
            ours_s.append(ours(store, ledger, key, n))
        ratio = statistics.median(ours_s) / statistics.median(raw_s)
        print(
            f"publish of an image step ({PICTURES} PNGs + receipts + envelope, "
            f"{len(image_step_payload(0)) + 1} objects), median of {args.rounds}:"
        )
        print(f"  raw puts      {statistics.median(raw_s) * 1000:8.1f} ms")
        print(
            f"  ours          {statistics.median(ours_s) * 1000:8.1f} ms  (create-only puts + "
            "hashing + claim + pointer transition)"
        )
        print(
            f"  ratio         {ratio:8.2f}x  (target <= {TARGET}x: "
            f"{'met' if ratio <= TARGET else 'NOT met'})"
        )
        # Scrub: one LIST per episode prefix, compared with the published manifests.
        manifests = {}
        for n in range(args.episodes):
            key = StepKey(project, f"s{n}", "ref_image_gen")
            run_id = f"scrub-{n}:0"
            attempt = store.attempt(key, run_id, "2026-12-01T00:00:00Z")
            objects = {"refs/C01.png": b"x" * 100, "refs/C02.png": b"y" * 100}
            for path, data in objects.items():
                attempt.put(path, data)
            manifests[key] = attempt.publishable(checkpoint_for(key, run_id, objects))
        start = time.perf_counter()
        for key, manifest in manifests.items():
            drift = store.scrub_episode(key.project_id, key.episode_id, [manifest])
            assert drift[0].clean
        per = (time.perf_counter() - start) / len(manifests)
        print(
            f"scrub: {per * 1000:.1f} ms per episode (1 LIST); a full pass over 10,000 "
            f"episodes spread over 3600 s = {10_000 / 3600:.1f} LIST/s"
        )


if __name__ == "__main__":
    main()
