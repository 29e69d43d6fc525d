"""Files of the pipeline, never read through a symbolic link (issue 10 §3).

The one definition of "a link where a file or directory of ours should be": the typed
``checkpoint.symlink`` refusal and the no-follow reads that raise it. Standard library
only, so the project config (``pipeline_defs.project``), the checkpoint store and the steps
share it without importing each other.
"""

import errno
import hashlib
import os
from pathlib import Path

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import PipelineError

SYMLINK_CODE = "checkpoint.symlink"
# Not on every platform (Windows): there a link is still caught by the lstat before opening.
O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def symlink_error(path: str | os.PathLike[str], what: str = "a file or directory") -> PipelineError:
    """The typed refusal of a symlink where ``what`` of the pipeline should be."""
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return PipelineError(
        SYMLINK_CODE,
        f"{path} is a symbolic link (to {target}) where {what} of the pipeline should be "
        f"[{SYMLINK_CODE}]: nothing is read or written through it and it is left in place; "
        "replace it by the real directory or file (or remove it) to go on",
        origin=Origin.CONTRACT_DRIFT.value,
        details={"path": str(path), "target": target},
    )


def open_nofollow(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of ``path``; a link in its place is ``checkpoint.symlink``.

    ``O_NOFOLLOW`` closes the gap between an ``lstat`` check and the open.
    """
    try:
        return os.open(path, os.O_RDONLY | O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise symlink_error(path, "a file") from None
        raise


def read_nofollow(path: str | os.PathLike[str]) -> bytes:
    with os.fdopen(open_nofollow(path), "rb") as handle:
        return handle.read()


def file_sha256(path: Path) -> str:
    """sha256 of a file of ours (never read through a link)."""
    digest = hashlib.sha256()
    with os.fdopen(open_nofollow(path), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
