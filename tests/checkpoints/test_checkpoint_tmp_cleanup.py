"""A checkpoint that fails to stage leaves no ``.checkpoint.*.tmp`` behind.

``CheckpointStore.stage`` writes the envelope to a temp file beside its target before the
fenced rename. Any failure before it returns the ``StagedCheckpoint`` (nobody else could
discard it then) must remove that temp file and let the error through with its errno.

The disk is really full: the home lives on a 64 KiB tmpfs mounted for the test (root
only). Where mounting is impossible, the fault is injected at ``os.fsync`` instead (a
filesystem fault; nothing about the database is simulated). The run-level test goes
through the real run protocol on SQLite and PostgreSQL.
"""

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from checkpoint_support import KEY, checkpoint, loaded
from judge_steps import make_data
from must_run import skip_or_fail
from sensor_steps import seed, stores_for

from pipeline_defs.resume.layout import ARCHIVE_DIR
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.store import CheckpointStore

PAGE = 4096


def temp_files(root: Path) -> list[Path]:
    return sorted(root.rglob(".checkpoint.*.tmp"))


@contextlib.contextmanager
def tiny_disk(path: Path, size: str = "64k") -> Iterator[bool]:
    """Mount a ``size`` tmpfs at ``path``; yields False (nothing mounted) if not allowed."""
    path.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError):
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", str(path)], check=True, capture_output=True)


def fill(disk: Path, leave_pages: int = 0) -> Path:
    """Fill the tmpfs to the last page, then free ``leave_pages`` pages (tmpfs allocates
    whole pages; directories take none). Unbuffered: a buffered flush would fail again."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * PAGE)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size - leave_pages * PAGE))
    return filler


def fail_fsync(monkeypatch: pytest.MonkeyPatch, code: int = errno.ENOSPC) -> None:
    """The fallback fault: fsync of a staged checkpoint fails as on a full disk."""
    real = os.fsync

    def fsync(fd: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith(".checkpoint.") and name.endswith(".tmp"):
            raise OSError(code, os.strerror(code))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_a_full_disk_while_writing_the_envelope_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with tiny_disk(tmp_path / "disk") as mounted:
        store = CheckpointStore(tmp_path / "disk" / "home")
        assert store.save(checkpoint("small"))
        published = store.path_for(KEY).read_bytes()
        if mounted:
            big = checkpoint(*[f"item-{n:06d}-" + "x" * 200 for n in range(400)])  # ~90 KB
        else:
            fail_fsync(monkeypatch)
            big = checkpoint("big")
        with pytest.raises(OSError) as caught:
            store.stage(big)
        assert caught.value.errno == errno.ENOSPC
        assert temp_files(store.root) == []
        # nothing else moved: the published envelope is intact, nothing was archived
        assert store.path_for(KEY).read_bytes() == published
        assert not (store.step_dir(KEY) / ARCHIVE_DIR).exists()
        with pytest.raises(OSError) as again:  # and through save() likewise
            store.save(big)
        assert again.value.errno == errno.ENOSPC
        assert temp_files(store.root) == []


def test_a_full_disk_when_archiving_the_replaced_envelope_leaves_no_temp_file(
    tmp_path: Path,
) -> None:
    """The temp file is written and fsynced, then archiving the previous envelope (which
    stage does before returning) finds the disk full: the temp must go too."""
    with tiny_disk(tmp_path / "disk") as mounted:
        if not mounted:
            skip_or_fail("needs a tmpfs mount (root): no fault injection reproduces this order")
        store = CheckpointStore(tmp_path / "disk" / "home")
        assert store.save(checkpoint("old"))
        published = store.path_for(KEY).read_bytes()
        assert len(published) < PAGE and len(checkpoint("new").to_json()) < PAGE
        fill(tmp_path / "disk", leave_pages=1)  # room for the temp file, not the archive
        with pytest.raises(OSError) as caught:
            store.stage(checkpoint("new"))
        assert caught.value.errno == errno.ENOSPC
        assert temp_files(store.root) == []
        assert [p.name for p in store.step_dir(KEY).rglob("*.tmp")] == []
        assert store.path_for(KEY).read_bytes() == published


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EDQUOT])
def test_a_failed_fsync_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    store = CheckpointStore(tmp_path / "home")
    assert store.save(checkpoint("a"))
    fail_fsync(monkeypatch, code)
    with pytest.raises(OSError) as caught:
        store.stage(checkpoint("b"))
    assert caught.value.errno == code
    assert temp_files(store.root) == []
    assert loaded(store, KEY).data == make_data(["a"])


def _errnos(exc: BaseException | None) -> list[int | None]:
    """Every errno along the exception chain (a caller may wrap the OSError in a typed
    error; the errno must still be there to read)."""
    found = []
    while exc is not None:
        if isinstance(exc, OSError):
            found.append(exc.errno)
        exc = exc.__cause__ or exc.__context__
    return found


def test_a_run_whose_publish_hits_a_full_disk_fails_without_a_temp_file(
    db_url: str, pipeline_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the run protocol, on a real ledger: the publish fails, the row is not
    completed, and the step directory holds no temp file."""
    stores = stores_for(pipeline_home, db_url)
    fail_fsync(monkeypatch)
    with pytest.raises(Exception) as caught:
        seed(stores, "p/e1", "src")
    assert errno.ENOSPC in _errnos(caught.value), caught.value
    key = StepKey("p", "e1", "src")
    row = stores.ledger.get(key)
    assert row is not None and row.status != "completed"
    assert stores.checkpoints.load(key) is None
    assert temp_files(stores.checkpoints.root) == []
