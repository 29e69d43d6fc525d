"""The storage contract on a local directory (the default: ``PIPELINE_HOME``).

Keys map to files below ``root`` with the same relative path, so the layout is today's.
Nothing below ``root`` is ever reached through a symbolic link: every directory is opened
with ``O_NOFOLLOW`` relative to its parent's descriptor (missing ones are made the same
way), and a link found anywhere on the way or at the key is a ``checkpoint.symlink``
refusal, nothing read, written or removed through it (docs/DESIGN.md#no-escape). ``root`` itself may
be a link: it is the home the operator chose.

Create-only puts are exact: the bytes go to a temp file beside the target, are fsynced, and
are *hard-linked* to the key (``link`` fails if the name exists, whoever made it, so a
second writer can never replace the first), then the temp name is removed and the
directory fsynced. The e_tag is the file's identity: mtime (ns), size and inode.

``put_if_match`` checks the identity and then renames over the object: there is no
compare-and-set primitive on a POSIX file system, so the check and the rename are two
steps. It is exact only while the caller holds the lock that serialises writers of the key
(the ledger row lock the run protocol takes); without it, it is best effort.
"""

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from pipeline_defs.resume.causes import storage_fault
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.files import O_NOFOLLOW, removed_on_error, symlink_error
from resources.storage.base import (
    TEMP_PREFIX,
    ObjectMeta,
    error_details,
    not_the_version,
    object_exists,
    object_missing,
    validate_key,
)

_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_ROOT_FLAGS = os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC
_DIR_FLAGS = _ROOT_FLAGS | O_NOFOLLOW
# O_NONBLOCK: a FIFO planted between the lstat and the open must not block the reader; the
# descriptor is fstat-checked before a byte is read.
_READ_FLAGS = os.O_RDONLY | O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | O_NOFOLLOW | _O_CLOEXEC
FILE_MODE = 0o644
DIR_MODE = 0o777  # the umask applies, as for every directory the pipeline makes


def local_e_tag(st: os.stat_result) -> str:
    """The identity of a file's bytes as this backend sees them: mtime (ns), size, inode.

    A rewrite in place changes the mtime; a replacement by rename changes the inode.
    """
    return f"{st.st_mtime_ns:x}-{st.st_size:x}-{st.st_ino:x}"


def _describe(mode: int) -> str:
    for test, words in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return words
    return "not a regular file"


class LocalStorage:
    """Objects as files below ``root`` (see the module docstring for the guarantees)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).absolute()

    @property
    def url(self) -> str:
        return str(self.root)

    @property
    def is_local(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"LocalStorage({self.url!r})"

    # -- the contract ------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        parts = validate_key(key, storage=self.url)
        with self._faults(key, "reading"):
            dir_fd = self._open_dirs(parts[:-1], key, create=False)
            if dir_fd is None:
                raise self._missing(key)
            try:
                fd = self._open_object(dir_fd, parts, key)
            finally:
                os.close(dir_fd)
            with os.fdopen(fd, "rb") as handle:
                return handle.read()

    def head(self, key: str) -> ObjectMeta | None:
        parts = validate_key(key, storage=self.url)
        with self._faults(key, "reading"):
            dir_fd = self._open_dirs(parts[:-1], key, create=False)
            if dir_fd is None:
                return None
            try:
                found = self._lstat(dir_fd, parts[-1])
            finally:
                os.close(dir_fd)
            if found is None:
                return None
            self._check_object(found, parts, key)
            return self._meta(key, found)

    def put_create(self, key: str, data: bytes) -> ObjectMeta:
        parts = validate_key(key, storage=self.url)
        name = parts[-1]
        with self._faults(key, "writing"):
            dir_fd = self._open_dirs(parts[:-1], key, create=True)
            if dir_fd is None:  # made, then removed by someone else before we could open it
                raise FileNotFoundError(errno.ENOENT, "directory removed while writing")
            try:
                found = self._lstat(dir_fd, name)
                if found is not None:  # the common conflict: refused before writing a byte
                    self._check_object(found, parts, key)
                    raise self._exists(key)
                temp, written = self._write_temp(dir_fd, data)
                try:
                    # link(2) never replaces: whoever made the name first, file or link, wins.
                    os.link(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
                except FileExistsError:
                    found = self._lstat(dir_fd, name)
                    if found is not None:
                        self._check_object(found, parts, key)
                    raise self._exists(key) from None
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(temp, dir_fd=dir_fd)
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return self._meta(key, written)

    def put_if_match(self, key: str, data: bytes, expected: ObjectMeta) -> ObjectMeta:
        """Replace the object if its identity is still ``expected.e_tag``.

        Exact only under the caller's lock on the key (the ledger row lock): the identity
        check and the rename are two steps (see the module docstring).
        """
        parts = validate_key(key, storage=self.url)
        name = parts[-1]
        with self._faults(key, "writing"):
            dir_fd = self._open_dirs(parts[:-1], key, create=False)
            if dir_fd is None:
                raise self._precondition(key, expected, None)
            try:
                found = self._lstat(dir_fd, name)
                if found is None:
                    raise self._precondition(key, expected, None)
                self._check_object(found, parts, key)
                current = self._meta(key, found)
                if expected.key != key or expected.e_tag != current.e_tag:
                    raise self._precondition(key, expected, current)
                temp, written = self._write_temp(dir_fd, data)
                with removed_on_error(temp, dir_fd=dir_fd):
                    os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return self._meta(key, written)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        # Validated now, not at the first next(): a bad prefix fails where it is passed.
        parts = validate_key(prefix, storage=self.url, what="prefix") if prefix != "" else ()
        return self._list(parts, prefix)

    def delete(self, key: str) -> None:
        """Remove the object's file (gc only); a link or a non-file there is refused."""
        parts = validate_key(key, storage=self.url)
        with self._faults(key, "deleting"):
            dir_fd = self._open_dirs(parts[:-1], key, create=False)
            if dir_fd is None:
                return
            try:
                found = self._lstat(dir_fd, parts[-1])
                if found is None:
                    return
                self._check_object(found, parts, key)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(parts[-1], dir_fd=dir_fd)
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    # -- walking without following links -----------------------------------------------

    def _open_root(self, *, create: bool) -> int | None:
        try:
            return os.open(self.root, _ROOT_FLAGS)
        except FileNotFoundError:
            if not create:
                return None
        os.makedirs(self.root, exist_ok=True)
        return os.open(self.root, _ROOT_FLAGS)

    def _open_dirs(
        self, parts: tuple[str, ...], key: str, *, create: bool, file_is_missing: bool = True
    ) -> int | None:
        """A descriptor of ``root/parts...``, every part opened no-follow from its parent.

        None when a part is missing (and ``create`` is false) or, for reads, when a part is
        a regular file (no object can be below it). A link is ``checkpoint.symlink``; for a
        write, a non-directory in the way is ``storage.not_an_object``.
        """
        fd = self._open_root(create=create)
        for index, part in enumerate(parts):
            if fd is None:
                return None
            try:
                child = self._open_child_dir(
                    fd,
                    part,
                    parts[: index + 1],
                    key,
                    create=create,
                    file_is_missing=file_is_missing,
                )
            finally:
                os.close(fd)
            fd = child
        return fd

    def _open_child_dir(
        self,
        parent_fd: int,
        name: str,
        parts: tuple[str, ...],
        key: str,
        *,
        create: bool,
        file_is_missing: bool,
    ) -> int | None:
        for attempt in (1, 2):
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
            except FileNotFoundError:
                if not create or attempt == 2:
                    return None
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                found = self._lstat(parent_fd, name)
                if found is None:  # removed meanwhile
                    if not create or attempt == 2:
                        return None
                elif stat.S_ISLNK(found.st_mode):
                    raise symlink_error(self.root.joinpath(*parts), "a directory") from None
                elif stat.S_ISREG(found.st_mode) and not create and file_is_missing:
                    return None
                else:
                    raise self._not_an_object(key, parts, found.st_mode, "a directory") from None
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
        return None

    def _lstat(self, dir_fd: int, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def _check_object(self, found: os.stat_result, parts: tuple[str, ...], key: str) -> None:
        """Refuse a link or a non-file where the object ``key`` should be."""
        if stat.S_ISLNK(found.st_mode):
            raise symlink_error(self.root.joinpath(*parts), "a file")
        if not stat.S_ISREG(found.st_mode):
            raise self._not_an_object(key, parts, found.st_mode, "an object")

    def _open_object(self, dir_fd: int, parts: tuple[str, ...], key: str) -> int:
        """A read descriptor of the object's file: lstat-checked first (a FIFO or a device
        is never opened), then opened no-follow, non-blocking, and fstat-checked."""
        name = parts[-1]
        found = self._lstat(dir_fd, name)
        if found is None:
            raise self._missing(key)
        self._check_object(found, parts, key)
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            raise self._missing(key) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise symlink_error(self.root.joinpath(*parts), "a file") from None
            raise
        try:
            opened = os.fstat(fd)
            self._check_object(opened, parts, key)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _write_temp(self, dir_fd: int, data: bytes) -> tuple[str, os.stat_result]:
        """A fsynced temp file in ``dir_fd`` holding ``data``: its name and identity."""
        temp = f"{TEMP_PREFIX}{uuid.uuid4().hex}"
        fd = os.open(temp, _TEMP_FLAGS, FILE_MODE, dir_fd=dir_fd)
        with removed_on_error(temp, dir_fd=dir_fd):
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
                written = os.fstat(fd)
            finally:
                os.close(fd)
        return temp, written

    def _list(self, parts: tuple[str, ...], prefix: str) -> Iterator[ObjectMeta]:
        with self._faults(prefix or "(all)", "listing"):
            fd = self._open_dirs(parts, prefix, create=False)
            if fd is None:
                return
            try:
                yield from self._walk(fd, parts)
            finally:
                os.close(fd)

    def _walk(self, fd: int, where: tuple[str, ...]) -> Iterator[ObjectMeta]:
        """Depth first; one descriptor per level is open at a time."""
        with os.scandir(fd) as entries:
            names = sorted(entry.name for entry in entries)
        for name in names:
            if name.startswith(TEMP_PREFIX):  # a put in flight, or a killed writer's leftover
                continue
            here = (*where, name)
            found = self._lstat(fd, name)
            if found is None:  # removed meanwhile (gc)
                continue
            key = "/".join(here)
            if stat.S_ISDIR(found.st_mode):
                child = self._open_child_dir(
                    fd, name, here, key, create=False, file_is_missing=False
                )
                if child is None:
                    continue
                try:
                    yield from self._walk(child, here)
                finally:
                    os.close(child)
            else:
                self._check_object(found, here, key)
                yield self._meta(key, found)

    # -- errors ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _faults(self, key: str, action: str) -> Iterator[None]:
        """An ``OSError`` nobody typed, as a typed storage error naming key and storage."""
        try:
            yield
        except OSError as exc:
            cause = f"{type(exc).__name__}: {exc}"
            fault = storage_fault(exc)
            if fault is not None:
                raise PipelineError(
                    fault.code,
                    f"{fault.message} {action} key {key!r} in storage {self.url}",
                    details=error_details(self.url, key, cause),
                ) from exc
            raise PipelineError(
                ErrorCode.STORAGE_UNAVAILABLE,
                f"storage {self.url} failed {action} key {key!r}: {cause}",
                details=error_details(self.url, key, cause),
            ) from exc

    def _meta(self, key: str, st: os.stat_result) -> ObjectMeta:
        return ObjectMeta(
            key=key,
            size=st.st_size,
            e_tag=local_e_tag(st),
            version=None,
            last_modified=datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=UTC),
        )

    def _missing(self, key: str) -> PipelineError:
        return object_missing(self.url, key, "no such file")

    def _exists(self, key: str) -> PipelineError:
        return object_exists(self.url, key, "a file is already there and objects are create-only")

    def _precondition(
        self, key: str, expected: ObjectMeta, current: ObjectMeta | None
    ) -> PipelineError:
        found = "no object" if current is None else f"e_tag {current.e_tag}"
        if expected.key != key:
            cause = f"the expected version is of key {expected.key!r}"
        else:
            cause = f"expected e_tag {expected.e_tag}, found {found}"
        versions = {
            "expected_e_tag": expected.e_tag,
            "current_e_tag": None if current is None else current.e_tag,
        }
        return not_the_version(self.url, key, cause, versions)

    def _not_an_object(
        self, key: str, parts: tuple[str, ...], mode: int, what: str
    ) -> PipelineError:
        path = self.root.joinpath(*parts)
        cause = f"{path} is {_describe(mode)}"
        return PipelineError(
            ErrorCode.STORAGE_NOT_AN_OBJECT,
            f"{cause}, where {what} of key {key!r} in storage {self.url} should be: it is "
            "neither opened nor changed; remove it to go on",
            details={**error_details(self.url, key, cause), "path": str(path)},
        )
