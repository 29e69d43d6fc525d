"""The ledger row is the commit pointer: publishing on a bucket, fenced by the claim.

Real ledgers (SQLite and PostgreSQL) and real storages (a directory and moto's S3): a
worker whose lease was taken over writes its objects (into its own attempt prefix: nothing
stops a put) but its publish matches no row, so the pointer, and every object it names,
stay the winner's. A later publish archives the pointer it replaces; the review's edit of a
victim is a compare-and-set on the pointer; garbage collection keeps whatever a current or
archived pointer or a live claim names and deletes the fenced worker's dead prefix.
"""

from datetime import UTC, datetime, timedelta

import pytest
from checkpoint_support import KEY, checkpoint

from resources.checkpoints.bucket import BucketCheckpoints, sha256_bytes
from resources.checkpoints.envelope import Artifact, Checkpoint
from resources.checkpoints.manifest import Manifest
from resources.ledger.store import LedgerStore
from resources.storage import Storage

FAR_FUTURE = datetime(2999, 1, 1, tzinfo=UTC)


def drawn(run_id: str, picture: bytes) -> Checkpoint:
    base = checkpoint("x", run_id=run_id)
    artifact = Artifact(path="refs/C01.png", sha256=sha256_bytes(picture), bytes=len(picture))
    return Checkpoint(**{**base.__dict__, "artifacts": (artifact,)})


def write(store: BucketCheckpoints, ledger: LedgerStore, run_id: str, picture: bytes) -> Manifest:
    """A run's work after its claim: objects under its own attempt, then the manifest."""
    row = ledger.get(KEY)
    assert row is not None and row.run_id == run_id and row.started_at
    attempt = store.attempt(KEY, run_id, row.started_at)
    attempt.put("refs/C01.png", picture)
    return attempt.publishable(drawn(run_id, picture))


@pytest.fixture
def ledger(db_url: str) -> LedgerStore:
    found = LedgerStore(db_url)
    found.migrate()
    return found


def test_a_fenced_worker_never_replaces_the_winners_pointer_or_objects(
    ledger: LedgerStore, storage: Storage
) -> None:
    store = BucketCheckpoints(storage)
    assert ledger.claim(KEY, "run-stale:0")
    stale_row = ledger.get(KEY)
    assert stale_row is not None
    # The stale worker stops (SIGSTOP, a long GC pause); its lease is taken over.
    assert ledger.claim(
        KEY,
        "run-winner:0",
        allow_stale_steal=True,
        expected_started_at=stale_row.started_at,
        expected_run_id=stale_row.run_id,
    )
    winner = write(store, ledger, "run-winner:0", b"winner's picture")
    assert ledger.transition(KEY, "run-winner:0", "completed", pointer=winner.encode())
    published = {key: storage.get(key) for key in winner.keys}
    # The stale worker wakes up, writes into its own prefix and tries to publish.
    stale_attempt = store.attempt(KEY, "run-stale:0", str(stale_row.started_at))
    stale_attempt.put("refs/C01.png", b"stale picture")
    stale = stale_attempt.publishable(drawn("run-stale:0", b"stale picture"))
    assert not ledger.transition(KEY, "run-stale:0", "completed", pointer=stale.encode())
    row = ledger.get(KEY)
    assert row is not None and row.checkpoint_pointer == winner.encode()
    assert {key: storage.get(key) for key in winner.keys} == published
    loaded = store.load(Manifest.decode(row.checkpoint_pointer))
    assert loaded is not None and loaded.run_id == "run-winner:0"
    assert stale.keys.isdisjoint(winner.keys)


def test_a_failed_rerun_keeps_the_published_pointer(ledger: LedgerStore, storage: Storage) -> None:
    store = BucketCheckpoints(storage)
    assert ledger.claim(KEY, "run-1:0")
    first = write(store, ledger, "run-1:0", b"first")
    assert ledger.transition(KEY, "run-1:0", "completed", pointer=first.encode())
    assert ledger.claim(KEY, "run-2:0")
    assert ledger.transition(KEY, "run-2:0", "failed", error="boom")
    row = ledger.get(KEY)
    assert row is not None and row.status == "failed"
    assert row.checkpoint_pointer == first.encode()  # as a local file stays in place


def test_a_new_publish_archives_the_old_pointer_and_gc_keeps_what_is_named(
    ledger: LedgerStore, storage: Storage
) -> None:
    store = BucketCheckpoints(storage)
    pointers: list[Manifest] = []
    for n in range(3):
        run_id = f"run-{n}:0"
        assert ledger.claim(KEY, run_id)
        manifest = write(store, ledger, run_id, f"picture {n}".encode())
        assert ledger.transition(KEY, run_id, "completed", pointer=manifest.encode())
        pointers.append(manifest)
    assert ledger.archived_pointers(KEY) == [pointers[1].encode(), pointers[0].encode()]
    # a fenced worker's dead prefix, never published
    dead = store.attempt(KEY, "run-dead:0", "2026-12-01T00:00:00Z")
    dead.put("refs/C01.png", b"dead")
    refs = ledger.references()
    kept = [Manifest.decode(p) for p in refs.pointers]
    running = [store.attempt(KEY, r, s).prefix for r, s in refs.claims]
    done = store.collect(kept, running, now=FAR_FUTURE, grace=timedelta(hours=1))
    assert done.deleted_prefixes == (dead.prefix,)
    for manifest in pointers:
        assert store.load(manifest) is not None


def test_the_reviews_edit_is_a_compare_and_set_on_the_victims_pointer(
    ledger: LedgerStore, storage: Storage
) -> None:
    store = BucketCheckpoints(storage)
    assert ledger.claim(KEY, "run-1:0")
    base = write(store, ledger, "run-1:0", b"base")
    assert ledger.transition(KEY, "run-1:0", "completed", pointer=base.encode())
    edit = store.attempt(KEY, "run-review:0", "2026-12-01T01:00:00Z")
    edit.put("refs/C01.png", b"base")
    edited = edit.publishable(drawn("run-review:0", b"base"))
    assert ledger.swap_pointer(KEY, expected=base.encode(), pointer=edited.encode(), run_id="r")
    # a second reviewer that read the old version loses
    assert not ledger.swap_pointer(KEY, expected=base.encode(), pointer="{}", run_id="r2")
    row = ledger.get(KEY)
    assert row is not None and row.checkpoint_pointer == edited.encode()
    # never while the victim is running
    assert ledger.claim(KEY, "run-2:0")
    assert not ledger.swap_pointer(KEY, expected=edited.encode(), pointer="{}", run_id="r3")


def test_gc_keeps_every_attempt_of_a_running_step_whatever_its_age(
    ledger: LedgerStore, storage: Storage
) -> None:
    """A worker uploads under an attempt named by what it will publish, before its commit:
    while its row is running, nothing under its step is collected, even past the grace
    period (a step that runs longer than it); once the row settles, the unnamed attempt is
    garbage."""
    store = BucketCheckpoints(storage)
    assert ledger.claim(KEY, "run-1:0")
    first = write(store, ledger, "run-1:0", b"first")
    assert ledger.transition(KEY, "run-1:0", "completed", pointer=first.encode())
    assert ledger.claim(KEY, "run-2:0")
    uploading = store.attempt(KEY, "run-2:0|content-of-the-upload", "2026-12-01T02:00:00Z")
    uploading.put("refs/C01.png", b"being drawn")
    refs = ledger.references()
    assert refs.running == [KEY]
    kept = [Manifest.decode(p) for p in refs.pointers]
    running = [store.step_prefix(k) for k in refs.running]
    done = store.collect(kept, running, now=FAR_FUTURE, grace=timedelta(hours=1))
    assert done.deleted_prefixes == () and done.kept_running == 1
    assert ledger.transition(KEY, "run-2:0", "failed", error="killed")
    refs = ledger.references()
    done = store.collect(
        [Manifest.decode(p) for p in refs.pointers],
        [store.step_prefix(k) for k in refs.running],
        now=FAR_FUTURE,
        grace=timedelta(hours=1),
    )
    assert done.deleted_prefixes == (uploading.prefix,)
