"""Files of the pipeline, never read through a symbolic link.

The one definition of "a link where a file or directory of ours should be": the typed
``checkpoint.symlink`` refusal and the no-follow reads that raise it. Standard library
only, so the project config (``pipeline_defs.project``), the checkpoint store and the steps
share it without importing each other.
"""

import contextlib
import errno
import hashlib
import os
import stat as stat_module
import uuid
from collections.abc import Iterator
from pathlib import Path

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import ErrorCode, PipelineError

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


def _open_dir_nofollow(name: str, parent_fd: int, shown: Path) -> int:
    """A descriptor of directory ``name`` in ``parent_fd``; a link there is refused."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(shown)):
            raise symlink_error(shown, "a directory") from None
        if exc.errno == errno.ENOTDIR:
            mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
            raise PipelineError(
                ErrorCode.INPUT_INVALID,
                f"{shown} is {describe_mode(mode)}, where a directory of the pipeline should "
                "be: nothing is written through it; remove it to go on",
                details={"path": str(shown)},
            ) from None
        raise


def write_file_under(root: Path, path: Path, payload: bytes) -> None:
    """Write ``payload`` atomically at ``path`` below ``root``, never through a link.

    Every component from ``root`` down (``root`` itself may be a link: it is the home the
    operator chose) is opened with ``O_NOFOLLOW`` relative to its parent's descriptor and
    missing directories are made the same way, so a link planted anywhere on the way,
    before or during the call, is a ``checkpoint.symlink`` refusal and nothing is created
    through it; a link or a non-file at the target itself is refused too (``os.replace``
    would delete the link, and SPEC: a link is left in place). The file is written as a
    temp file beside the target, fsynced and renamed: readers see the old or the new bytes.
    """
    parts = Path(path).relative_to(root).parts  # lexical: never resolved
    if not parts or ".." in parts:
        raise ValueError(f"{path} is not a file below {root}")
    # The home itself is the operator's choice (it may be a link, or not exist yet).
    os.makedirs(root, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        shown = Path(root)
        for part in parts[:-1]:
            shown = shown / part
            try:
                child = _open_dir_nofollow(part, fd, shown)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
                child = _open_dir_nofollow(part, fd, shown)
            os.close(fd)
            fd = child
        name = parts[-1]
        target = shown / name
        try:
            found = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            found = None
        if found is not None and stat_module.S_ISLNK(found.st_mode):
            raise symlink_error(target, "a file")
        if found is not None and not stat_module.S_ISREG(found.st_mode):
            raise PipelineError(
                ErrorCode.INPUT_INVALID,
                f"{target} is {describe_mode(found.st_mode)}, where a file of the pipeline "
                "should be: nothing is written over it; remove it to go on",
                details={"path": str(target)},
            )
        temp = f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW, 0o644, dir_fd=fd)
        with removed_on_error(temp, dir_fd=fd):
            with os.fdopen(out, "wb") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def removed_on_error(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> Iterator[None]:
    """Remove ``path`` (a temp file being written) if the block fails, then re-raise.

    Here, not in an adapter, so the atomic writes of the core, the checkpoint store and the
    local object store share it (the storage adapter may import no other adapter).
    """
    try:
        yield
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path, dir_fd=dir_fd)
        raise


def describe_mode(mode: int) -> str:
    """What a non-regular entry is, in words an operator recognises."""
    for test, words in (
        (stat_module.S_ISDIR, "a directory"),
        (stat_module.S_ISLNK, "a symbolic link"),
        (stat_module.S_ISFIFO, "a named pipe (FIFO)"),
        (stat_module.S_ISCHR, "a character device"),
        (stat_module.S_ISBLK, "a block device"),
        (stat_module.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return words
    return "not a regular file" if not stat_module.S_ISREG(mode) else "a regular file"
