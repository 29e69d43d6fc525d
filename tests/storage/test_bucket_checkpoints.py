"""Checkpoints on object storage: immutable attempts, the manifest as commit pointer.

Every test runs on a local directory and on S3 (moto). What a bucket is attacked with is
done for real: objects deleted, overwritten, an older copy put back under the published
key, a second owner writing the same step. The ledger side (the pointer update only while
the owner holds the row) is tested with the ledger; here: what the objects and manifests
guarantee on their own.
"""

from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest
from checkpoint_support import KEY, checkpoint

from pipeline_defs.resume.errors import PipelineError
from resources.checkpoints.bucket import Attempt, BucketCheckpoints, attempt_id, sha256_bytes
from resources.checkpoints.envelope import Artifact, Checkpoint
from resources.checkpoints.manifest import Manifest
from resources.storage import ObjectMeta, Storage

PNG_A = b"\x89PNG picture A" * 50
PNG_B = b"\x89PNG picture B" * 50
FAR_FUTURE = datetime(2999, 1, 1, tzinfo=UTC)


@dataclass
class Counting:
    """A real storage that counts the requests made through it (no behaviour changed)."""

    inner: Storage
    calls: int = 0

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def is_local(self) -> bool:
        return self.inner.is_local

    def get(self, key: str) -> bytes:
        self.calls += 1
        return self.inner.get(key)

    def head(self, key: str) -> ObjectMeta | None:
        self.calls += 1
        return self.inner.head(key)

    def put_create(self, key: str, data: bytes) -> ObjectMeta:
        self.calls += 1
        return self.inner.put_create(key, data)

    def put_if_match(self, key: str, data: bytes, expected: ObjectMeta) -> ObjectMeta:
        self.calls += 1
        return self.inner.put_if_match(key, data, expected)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        self.calls += 1
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.calls += 1
        self.inner.delete(key)


def with_pictures(base: Checkpoint, **pictures: bytes) -> Checkpoint:
    return replace(
        base,
        artifacts=tuple(
            Artifact(path=f"refs/{name}.png", sha256=sha256_bytes(data), bytes=len(data))
            for name, data in sorted(pictures.items())
        ),
    )


def publish(store: BucketCheckpoints, run_id: str, **pictures: bytes) -> tuple[Manifest, Attempt]:
    """What a run does: write its objects create-only, then build the manifest."""
    attempt = store.attempt(KEY, run_id, "2026-12-01T20:00:00.000000Z")
    for name, data in pictures.items():
        attempt.put(f"refs/{name}.png", data)
    cp = with_pictures(checkpoint("x", "y", run_id=run_id), **pictures)
    return attempt.publishable(cp), attempt


def test_a_published_checkpoint_round_trips_through_its_manifest(storage: Storage) -> None:
    store = BucketCheckpoints(storage)
    manifest, _ = publish(store, "run-1:0", C01=PNG_A, C02=PNG_B)
    decoded = Manifest.decode(manifest.encode())
    assert decoded == manifest
    loaded = store.load(decoded)
    assert loaded is not None and loaded.content_hash == manifest.content_hash
    assert store.read_artifact(decoded, "refs/C01.png") == PNG_A
    assert store.artifact_problems(decoded) == ([], [])
    assert all(
        k.startswith(f"checkpoints/proj1/ep1/alpha/{manifest.attempt}/") for k in decoded.keys
    )


def test_two_owners_write_apart_and_never_touch_each_others_objects(storage: Storage) -> None:
    """A fenced worker writes only into its own (dead) prefix: the winner's bytes stay."""
    store = BucketCheckpoints(storage)
    winner, _ = publish(store, "run-winner:1", C01=PNG_A)
    before = {k: storage.get(k) for k in winner.keys}
    loser, _ = publish(store, "run-stale:0", C01=PNG_B)
    assert winner.keys.isdisjoint(loser.keys)
    assert {k: storage.get(k) for k in winner.keys} == before
    assert store.read_artifact(winner, "refs/C01.png") == PNG_A


def test_an_object_is_never_overwritten_within_an_attempt(storage: Storage) -> None:
    store = BucketCheckpoints(storage)
    attempt = store.attempt(KEY, "run-1:0", "2026-12-01T20:00:00Z")
    first = attempt.put("refs/C01.png", PNG_A)
    assert attempt.put("refs/C01.png", PNG_A) == first  # a retried put finds its own bytes
    with pytest.raises(PipelineError) as caught:
        attempt.put("refs/C01.png", PNG_B)
    assert caught.value.code == "storage.object_exists"
    assert storage.get(first.key) == PNG_A


def test_a_manifest_names_only_what_the_attempt_wrote(storage: Storage) -> None:
    store = BucketCheckpoints(storage)
    attempt = store.attempt(KEY, "run-1:0", "2026-12-01T20:00:00Z")
    attempt.put("refs/C01.png", PNG_A)
    claimed = with_pictures(checkpoint("x"), C01=PNG_B)  # lists other bytes than written
    with pytest.raises(PipelineError) as caught:
        attempt.publishable(claimed)
    assert caught.value.code == "checkpoint.invalid" and "refs/C01.png" in caught.value.message


def test_a_deleted_picture_is_missing_and_a_replaced_one_is_changed(storage: Storage) -> None:
    store = BucketCheckpoints(storage)
    manifest, _ = publish(store, "run-1:0", C01=PNG_A, C02=PNG_B)
    storage.delete(manifest.artifacts["refs/C01.png"].key)
    replaced = manifest.artifacts["refs/C02.png"].key
    storage.delete(replaced)
    storage.put_create(replaced, PNG_A)  # someone with delete rights put other bytes back
    missing, changed = store.artifact_problems(manifest)
    assert missing == ["refs/C01.png (missing)"]
    assert changed and changed[0].startswith("refs/C02.png")
    with pytest.raises(PipelineError) as caught:
        store.read_artifact(manifest, "refs/C02.png")
    assert caught.value.code == "io.integrity_violation" and replaced in caught.value.message


def test_an_older_envelope_put_back_is_a_block_naming_it(storage: Storage) -> None:
    """The redraw-undone attack: the previous version's bytes copied over the published
    key. Its own content hash is valid; only the manifest tells it apart."""
    store = BucketCheckpoints(storage)
    old, _ = publish(store, "run-1:0", C01=PNG_A)
    new, _ = publish(store, "run-2:0", C01=PNG_B)
    storage.delete(new.envelope.key)
    storage.put_create(new.envelope.key, storage.get(old.envelope.key))
    with pytest.raises(PipelineError) as caught:
        store.load(new)
    assert caught.value.code == "io.integrity_violation"
    assert new.envelope.key in caught.value.message and caught.value.origin == "invariant_drift"


def test_a_deleted_envelope_loads_as_absent(storage: Storage) -> None:
    store = BucketCheckpoints(storage)
    manifest, _ = publish(store, "run-1:0", C01=PNG_A)
    storage.delete(manifest.envelope.key)
    assert store.load(manifest) is None
    assert store.load(None) is None


def test_a_scrub_is_one_list_per_episode_and_finds_drift(storage: Storage) -> None:
    counting = Counting(storage)
    store = BucketCheckpoints(counting)
    clean, _ = publish(store, "run-1:0", C01=PNG_A, C02=PNG_B)
    drifted = replace(
        clean,
        artifacts={**clean.artifacts, "refs/C03.png": replace(clean.artifacts["refs/C01.png"])},
        step=replace(KEY, step_id="beta"),
    )
    gone = drifted.artifacts["refs/C03.png"]
    drifted = replace(
        drifted,
        artifacts={
            **drifted.artifacts,
            "refs/C03.png": replace(gone, key=gone.key.replace("C01", "C03")),
        },
    )
    counting.calls = 0
    found = store.scrub_episode("proj1", "ep1", [clean, drifted])
    assert counting.calls == 1  # one LIST, whatever the number of steps and objects
    assert found[0].clean
    assert found[1].missing == ("refs/C03.png",)
    storage.delete(clean.artifacts["refs/C02.png"].key)
    storage.put_create(clean.artifacts["refs/C02.png"].key, b"other bytes of another size")
    again = store.scrub_episode("proj1", "ep1", [clean])
    assert again[0].changed == ("refs/C02.png",)


def test_collect_keeps_what_any_manifest_names_and_deletes_dead_prefixes(storage: Storage) -> None:
    store = BucketCheckpoints(storage)
    dead, _ = publish(store, "run-dead:0", C01=PNG_B)  # a fenced worker's attempt
    old, _ = publish(store, "run-1:0", C01=PNG_A, C02=PNG_B)
    # The next attempt reuses C01 of the old one, copy-free, and draws C02 again.
    attempt = store.attempt(KEY, "run-2:0", "2026-12-01T21:00:00Z")
    attempt.reuse("refs/C01.png", old.artifacts["refs/C01.png"])
    attempt.put("refs/C02.png", PNG_A)
    current = attempt.publishable(
        with_pictures(checkpoint("x", run_id="run-2:0"), C01=PNG_A, C02=PNG_A)
    )
    running = store.attempt(KEY, "run-3:0", "2026-12-01T22:00:00Z")
    running.put("refs/C09.png", PNG_B)
    dry = store.collect(
        [current], [running.prefix], now=FAR_FUTURE, grace=timedelta(hours=1), dry_run=True
    )
    assert dry.deleted_prefixes == (f"checkpoints/proj1/ep1/alpha/{dead.attempt}",)
    assert storage.head(dead.envelope.key) is not None  # a dry run deletes nothing
    young = store.collect(
        [current], [running.prefix], now=datetime.now(UTC), grace=timedelta(hours=1)
    )
    assert young.deleted_prefixes == () and young.kept_young == 1
    done = store.collect([current], [running.prefix], now=FAR_FUTURE, grace=timedelta(hours=1))
    assert done.deleted_prefixes == dry.deleted_prefixes
    assert storage.head(dead.envelope.key) is None
    for key in current.keys | old.keys:  # the reused attempt stays whole
        assert storage.head(key) is not None, key
    assert storage.head(running.key_of("refs/C09.png")) is not None
    assert store.load(current) is not None


def test_a_malformed_manifest_is_a_typed_block() -> None:
    for text in ("not json", "{}", '{"v": 1, "step": ["a"]}'):
        with pytest.raises(PipelineError) as caught:
            Manifest.decode(text, where="row proj1/ep1/alpha")
        assert caught.value.code == "checkpoint.invalid"
        assert caught.value.origin == "contract_drift"


def test_attempt_ids_are_unique_per_owner_and_sort_by_claim() -> None:
    a = attempt_id("run-1:0", "2026-12-01T20:00:00.000001Z")
    b = attempt_id("run-1:1", "2026-12-01T20:00:00.000001Z")
    c = attempt_id("run-1:0", "2026-12-01T21:00:00.000001Z")
    assert len({a, b, c}) == 3 and sorted([c, a]) == [a, c]
