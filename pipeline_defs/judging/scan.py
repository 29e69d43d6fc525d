"""The tick's filesystem scan: the stat identities that tell a tick a partition changed.

Per partition one flat tuple of ints (cheap to compare, hash and keep for thousands of
partitions), laid out by a :class:`PartitionScan`:

- one ``lstat`` per step directory ``checkpoints/<p>/<e>/<step>/`` and per artifact
  sub-directory the envelopes name: writing a checkpoint (atomic rename), deleting
  ``checkpoint.json``, deleting or adding a PNG, a force marker or an archive all change
  the mtime of the directory that holds the entry;
- the project (``project.yaml`` and the directories on the way, watched for links only),
  the episode's checkpoint directory (links only), the episode input directory, each step's
  ``checkpoint.json`` (mtime and size: an edit written over the file in place leaves its
  directory as it was) and the input files seen.

Every stat is an ``lstat`` (docs/DESIGN.md#no-escape): a dir moved out and linked back keeps its
identity through the link, so every directory on the way is taken itself.
"""

import functools
import hashlib
import os
import stat
from array import array
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol

from pipeline_defs.resume.identity import (
    ABSENT,
    NOT_A_LINK,
    Identity,
    directory_identity,
    file_identity_or_absent,
    link_identity,
)
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import Episode


class Scan(NamedTuple):
    """Stat identities of one partition: step (and artifact) dirs, config, input files.

    ``ints`` is laid out by a :class:`PartitionScan`.
    """

    ints: tuple[int, ...]
    inputs: tuple[str, ...]
    input_dir: Identity


NO_SCAN = Scan((), (), ABSENT)
_PAIR = 2  # ints per directory identity: (mtime_ns, inode)


class PartitionScan:
    """Which directories a partition's scan stats, and where each identity sits in it.

    Per step in judging order, the step directory's identity and then each of its artifact
    sub-directories'; after the steps, the tail (project, links, the episode's input
    directory and files). This class is the only place that knows the offsets, so
    scanning, widening and the judge's lookups cannot disagree.
    """

    def __init__(self, step_ids: Sequence[str], subdirs: Mapping[str, Sequence[str]]) -> None:
        # Every known step's sub-directories are kept (the cursor carries them), also of
        # steps not judged here; only the judged steps take room in a scan.
        self.subdirs: dict[str, tuple[str, ...]] = {
            k: tuple(v) for k, v in sorted(subdirs.items()) if v
        }
        self.steps = tuple((s, self.subdirs.get(s, ())) for s in step_ids)
        self._at: dict[str, int] = {}
        relative: list[str] = []
        position = 0
        for step_id, subs in self.steps:
            self._at[step_id] = position
            relative.append(step_id)
            relative.extend(f"{step_id}/{sub}" for sub in subs)
            position += _PAIR * (1 + len(subs))
        self.tail = position  # where the partition's tail starts
        # The directories in scan order, relative to the episode's checkpoint directory.
        self.relative = tuple(relative)

    def step_identity(self, ints: Sequence[int], step_id: str) -> Identity:
        """The step directory's identity in a scan (ABSENT for an empty scan)."""
        at = self._at[step_id]
        return tuple(ints[at : at + _PAIR]) if len(ints) >= at + _PAIR else ABSENT

    def widen(self, ints: Sequence[int], wider: "PartitionScan", base: str) -> tuple[int, ...]:
        """``ints`` laid out as ``wider``: identities already known are copied, only the
        newly named sub-directories (under ``base``, the episode's checkpoint directory
        with a trailing slash) are stat'ed."""
        out: list[int] = []
        for step_id, subs in wider.steps:
            at = self._at[step_id]
            out.extend(ints[at : at + _PAIR])
            old = self.subdirs.get(step_id, ())
            for sub in subs:
                if sub in old:
                    sub_at = at + _PAIR * (1 + old.index(sub))
                    out.extend(ints[sub_at : sub_at + _PAIR])
                else:
                    out.extend(directory_identity(f"{base}{step_id}/{sub}"))
        out.extend(ints[self.tail :])
        return tuple(out)


class KnownInputs(Protocol):
    """What the last tick saw of a partition's input directory (a memo has it)."""

    @property
    def input_dir(self) -> Identity: ...

    @property
    def inputs(self) -> tuple[str, ...]: ...


def scan_partitions(
    layout: DataLayout,
    keys: Sequence[str],
    shape: PartitionScan,
    known: Mapping[str, KnownInputs],
) -> dict[str, Scan]:
    """Stat identities of every partition (step dirs, artifact dirs, inputs, config).

    ``known``: what the last tick saw per partition; an input directory with the same
    identity has the same entries, so only the files seen before are stat'ed in it.
    """
    relative = shape.relative
    projects: dict[str, Identity] = {}
    # lstat, never stat (docs/DESIGN.md#no-escape): the two roots here, the project dirs below,
    # each episode directory in one().
    roots = (*link_identity(layout.checkpoints), *link_identity(layout.projects))
    for pk in keys:
        episode = episode_of(pk)
        if episode is not None and episode.project_id not in projects:
            p = episode.project_id
            projects[p] = (
                *file_identity_or_absent(layout.project_file(p)),
                *link_identity(layout.project_dir(p)),
                *link_identity(layout.episodes_dir(p)),
                *link_identity(layout.checkpoint_project_dir(p)),
                *roots,
            )

    lstat, is_link = os.lstat, stat.S_ISLNK
    envelopes = tuple(DataLayout.checkpoint_in(step_id) for step_id, _ in shape.steps)
    scans: dict[str, Scan] = {}
    # One flat loop, the stat calls inlined (this is all a warm tick does per partition):
    # the same identities as directory_identity / file_identity_or_absent / link_identity
    # (pipeline_defs.resume.identity), without a call and a tuple per directory. Threads do
    # not help: the GIL, not the syscalls.
    for pk in keys:
        episode = episode_of(pk)
        if episode is None:
            scans[pk] = NO_SCAN
            continue
        p, e = episode.project_id, episode.episode_id
        ints: list[int] = []
        add = ints.append
        base = layout.checkpoint_episode_dir(p, e)
        for directory in relative:
            try:
                st = lstat(f"{base}/{directory}")
            except OSError:
                add(-1)  # ABSENT
                add(-1)
            else:
                add(st.st_mtime_ns)
                add(st.st_ino)
        ints.extend(projects.get(p, ABSENT))
        try:  # the episode's checkpoint directory, for links only (see link_identity())
            st = lstat(base)
        except OSError:
            ints.extend(NOT_A_LINK)
        else:
            ints.extend((st.st_ino, 1) if is_link(st.st_mode) else NOT_A_LINK)
        input_dir = layout.episode_dir(p, e)
        try:
            st = lstat(input_dir)
        except OSError:
            ident = ABSENT
        else:
            ident = (st.st_mtime_ns, st.st_ino)
        ints.extend(ident)
        # Each step's envelope, by (mtime_ns, size): an edit written over the file in place
        # (an editor that truncates and writes) leaves its directory as it was.
        for envelope in envelopes:
            try:
                st = lstat(f"{base}/{envelope}")
            except OSError:
                add(-1)  # ABSENT
                add(-1)
            else:
                add(st.st_mtime_ns)
                add(st.st_size)
        seen = known.get(pk)
        if seen is not None and ident != ABSENT and seen.input_dir == ident:
            names = seen.inputs  # same directory entries: stat the known files only
        else:
            names = list_files(input_dir)
        for name in names:
            try:
                st = lstat(f"{input_dir}/{name}")
            except OSError:
                add(-1)  # ABSENT
                add(-1)
            else:
                add(st.st_mtime_ns)
                add(st.st_size)
                add(st.st_ino)
        scans[pk] = Scan(tuple(ints), names, ident)
    return scans


def tree_digest(keys: Sequence[str], scanned: Mapping[str, Scan]) -> str:
    """One digest of every partition's scan (the cursor's ``tree``)."""
    h = hashlib.blake2b(digest_size=16)
    for pk in keys:
        scan = scanned[pk]
        h.update(pk.encode("utf-8"))
        h.update(array("q", scan.ints).tobytes())
        h.update("\0".join(scan.inputs).encode("utf-8"))
    return h.hexdigest()


def list_files(path: str) -> tuple[str, ...]:
    try:
        with os.scandir(path) as entries:
            return tuple(sorted(e.name for e in entries if e.is_file(follow_symlinks=False)))
    except OSError:
        return ()


@functools.lru_cache(maxsize=1 << 18)
def episode_of(pk: str) -> Episode | None:
    """The partition's episode, None for a malformed key (cached: every tick asks for every
    partition, and an ``Episode`` is immutable)."""
    try:
        return Episode.parse(pk)
    except Exception:
        return None
