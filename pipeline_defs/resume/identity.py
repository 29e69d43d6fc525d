"""Stat identities: the one definition of "this file or directory is unchanged".

What the checkpoint store seals and caches (:mod:`resources.checkpoints.seal`), what the
sensor's tick watches (:mod:`pipeline_defs.judging.scan`) and what the judge memoizes
(:mod:`pipeline_defs.judging.evaluation`) all take their identities, and their sentinels,
from here, so they cannot drift apart.

Always ``lstat`` (docs/DESIGN.md#no-escape): a link has its own identity and is noticed,
never followed. For regular files and directories that is the ``stat`` identity.

The values are persisted: seals in the ledger hold file identities and
:data:`ABSENT_FILE`; the sensor's cursor digests the scan's ints, which hold
:data:`ABSENT` and :data:`NOT_A_LINK`. Changing a value (or the order of a tuple) voids
every stored seal and cursor.

Pure: imports nothing but the standard library (the core, see ``[tool.importlinter]``).
"""

import os
import stat

# ----------------------------------------------------------------------------- types
FileIdentity = tuple[int, int, int]  # (st_mtime_ns, st_size, st_ino)
DirIdentity = tuple[int, int]  # (st_mtime_ns, st_ino): moves when an entry is added/removed
# Any identity a scan or a judge's memo compares: a file's, a directory's or a sentinel.
Identity = tuple[int, ...]

# ----------------------------------------------------------------------------- sentinels
# Absent, as the scan and the judge record it (a directory or a file alike): two ints.
ABSENT: Identity = (-1, -1)
# Absent, as a seal records a read that did not exist (a SealedFile's three ints): its
# appearance voids the seal.
ABSENT_FILE: FileIdentity = (-1, -1, -1)
# No file has it: a project whose config was refused (a link on the way) is read again.
REFUSED: Identity = (-2, -2, -2)
# A directory on the way that is not a link (or is absent): see :func:`link_identity`.
NOT_A_LINK: Identity = (0, 0)


# ----------------------------------------------------------------------------- of a stat
def stat_identity(st: os.stat_result) -> FileIdentity:
    """(mtime_ns, size, inode) of a stat result: what seals, caches and scans compare."""
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def dir_stat_identity(st: os.stat_result) -> DirIdentity:
    """(mtime_ns, inode) of a directory's stat result (its size says nothing useful)."""
    return (st.st_mtime_ns, st.st_ino)


# ----------------------------------------------------------------------------- of a path
def file_identity(path: str | os.PathLike[str]) -> FileIdentity | None:
    """(mtime_ns, size, inode) of the entry at ``path`` (``lstat``), or None when absent.

    Of a file or a directory (a directory's mtime moves whenever an entry is added, removed
    or renamed in it). A file replaced by a link, even to the file moved elsewhere, has the
    link's own identity.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def dir_identity(path: str | os.PathLike[str]) -> DirIdentity | None:
    """(mtime_ns, inode) of the entry at ``path`` (``lstat``), or None when absent."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_ino)


def own_file_identity(path: str | os.PathLike[str]) -> FileIdentity | None:
    """Like :func:`file_identity`, but None for a link too (as if absent).

    For the files of ours a seal covers (the envelope, the artifacts), where a link is
    never legitimate: a link forged with a reused inode and the original mtime still never
    matches a sealed file, so a holding seal proves every file it covers is a regular file
    in place, and readers need not scan for links beside them.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def is_link(path: str | os.PathLike[str]) -> bool:
    """Whether the entry at ``path`` is a symlink (False when absent)."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def directory_identity(path: str) -> Identity:
    """(mtime_ns, inode) of a directory, or :data:`ABSENT`; a file deleted or renamed inside
    changes it. ``lstat``: a directory replaced by a link (even to itself, moved) changes
    identity."""
    return dir_identity(path) or ABSENT


def file_identity_or_absent(path: str) -> Identity:
    """(mtime_ns, size, inode) of a file, or :data:`ABSENT` (two ints, as the scan and the
    judge record any absent entry; a seal records :data:`ABSENT_FILE` instead)."""
    return file_identity(path) or ABSENT


def link_identity(path: str) -> Identity:
    """A directory on the way: (inode, 1) when it is a link, else :data:`NOT_A_LINK`.

    Only a link matters here: whatever it points to would be seen through it unchanged.
    Real directories appearing or changing are not a change of their own (a new episode
    must not re-judge every partition of the project): the entries below are watched.
    """
    try:
        st = os.lstat(path)
    except OSError:
        return NOT_A_LINK
    return (st.st_ino, 1) if stat.S_ISLNK(st.st_mode) else NOT_A_LINK
