"""Atomic file writes: readers of a file we write see the old bytes or the new, never half.

Temp file in the same directory, fsync, rename, fsync of the directory. A failure removes
the temp file and names the file being written (a write through a descriptor carries no
filename, and the operator needs to know which file: pipeline_defs.resume.causes).
"""

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pipeline_defs.resume.files import fsync_dir, removed_on_error

__all__ = ["atomic_write_bytes", "named_errors", "naming", "removed_on_error"]


def naming(exc: BaseException, target: Path) -> OSError | None:
    """``exc`` again with the file it was writing, or None to re-raise it as it is.

    A write through a descriptor (a full disk in ``write`` or ``fsync``) carries no
    filename, and the operator needs to know which file (pipeline_defs.resume.causes).
    """
    if not isinstance(exc, OSError) or exc.filename is not None or exc.errno is None:
        return None
    return type(exc)(exc.errno, exc.strerror, str(target))


@contextlib.contextmanager
def named_errors(target: Path) -> Iterator[None]:
    """Re-raise a failure of the block naming ``target`` when it names no file."""
    try:
        yield
    except BaseException as exc:
        named = naming(exc, target)
        if named is not None:
            raise named from exc
        raise


def atomic_write_bytes(target: Path, payload: bytes) -> None:
    """Temp file in the same directory, fsync, rename: readers see old or new, never half."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    with named_errors(target), removed_on_error(temp):
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
        fsync_dir(target.parent)
