"""CheckpointStore on plain files: atomic publish, archives, force markers, idempotent saves."""

import json
import os
from pathlib import Path

import pytest
from checkpoint_support import KEY, checkpoint, loaded
from judge_steps import make_data

from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.layout import ARCHIVE_DIR, FORCE_MARKER
from resources.checkpoints.store import CheckpointStore


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "home", keep_archives=2)


def archives(store: CheckpointStore) -> list[Path]:
    folder = store.step_dir(KEY) / ARCHIVE_DIR
    return sorted(folder.glob("*.json")) if folder.exists() else []


def test_save_round_trips_and_identical_content_is_never_rewritten(
    store: CheckpointStore,
) -> None:
    assert store.save(checkpoint("a"))
    path = store.path_for(KEY)
    stat = path.stat()
    loaded = store.load(KEY)
    assert loaded is not None and loaded.data == make_data(["a"])
    assert json.loads(path.read_text())["content_hash"] == loaded.content_hash
    # same content from another run: provenance differs, identity does not → no write
    assert not store.save(checkpoint("a", run_id="run-2:0"))
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == (stat.st_mtime_ns, stat.st_ino)
    assert archives(store) == []
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_a_replaced_checkpoint_is_archived_and_archives_are_bounded(
    store: CheckpointStore,
) -> None:
    versions = [checkpoint(str(i)) for i in range(4)]
    for version in versions:
        assert store.save(version)
    kept = [json.loads(p.read_text())["data"]["items"] for p in archives(store)]
    assert kept == [["1"], ["2"]]  # the newest keep_archives=2 replaced versions
    assert loaded(store, KEY).data["items"] == ["3"]


def test_a_refused_fence_publishes_nothing(store: CheckpointStore) -> None:
    assert store.save(checkpoint("mine"))
    before = store.path_for(KEY).read_bytes()

    def refuse(commit: object) -> None:
        raise PipelineError("step.ownership_lost", "no longer the owner")

    with pytest.raises(PipelineError):
        store.save(checkpoint("theirs"), fence=refuse)
    assert store.path_for(KEY).read_bytes() == before
    assert [p.name for p in store.step_dir(KEY).iterdir() if p.name.endswith(".tmp")] == []


def test_force_clear_archives_marks_and_the_next_save_removes_the_marker(
    store: CheckpointStore,
) -> None:
    assert store.save(checkpoint("old"))
    before = store.path_for(KEY).read_bytes()
    archived = store.force_clear(KEY)
    assert archived is not None and archived.read_bytes() == before
    assert not store.path_for(KEY).exists()
    assert store.load(KEY) is None
    assert store.has_force_marker(KEY)
    assert (store.step_dir(KEY) / FORCE_MARKER).read_text() == archived.name
    assert store.save(checkpoint("new"))
    assert not store.has_force_marker(KEY)
    assert archived.read_bytes() == before  # the archive outlives the marker


def test_force_clear_of_nothing_still_marks(store: CheckpointStore) -> None:
    assert store.force_clear(KEY) is None
    assert store.has_force_marker(KEY)


def test_the_load_cache_notices_a_changed_file(store: CheckpointStore) -> None:
    assert store.save(checkpoint("a"))
    assert loaded(store, KEY).data["items"] == ["a"]
    raw = json.loads(store.path_for(KEY).read_text())
    raw["data"]["items"] = ["b"]
    path = store.path_for(KEY)
    path.write_text(json.dumps(raw))
    os.utime(path, ns=(1, 1))
    with pytest.raises(PipelineError) as caught:  # content hash no longer matches
        store.load(KEY)
    assert caught.value.origin == "invariant_drift"


def test_artifacts_cannot_escape_their_step_directory(store: CheckpointStore) -> None:
    with pytest.raises(PipelineError) as caught:
        store.write_artifact(KEY, "../beta/out.png", b"x")
    assert caught.value.code == "input.invalid"
    artifact = store.write_artifact(KEY, "out/a.png", b"png")
    assert (store.step_dir(KEY) / "out" / "a.png").read_bytes() == b"png"
    assert artifact.bytes == 3


def test_artifact_problems_separate_missing_from_changed(store: CheckpointStore) -> None:
    kept = store.write_artifact(KEY, "a.png", b"aa")
    gone = store.write_artifact(KEY, "b.png", b"bb")
    cp = checkpoint("x").with_changes(artifacts=(kept, gone))
    assert store.artifact_problems(cp) == ([], [])
    (store.step_dir(KEY) / "a.png").write_bytes(b"AA")
    (store.step_dir(KEY) / "b.png").unlink()
    assert store.artifact_problems(cp) == (["b.png (missing)"], ["a.png (sha256 mismatch)"])
    assert store.check_artifacts(cp) == ["b.png (missing)", "a.png (sha256 mismatch)"]
