"""Checkpoint seals: what a run verified when it published, re-checkable with ``stat`` alone.

A run publishes a completed checkpoint only after verifying it: the envelope, every
artifact's sha256 and the files its verifier reads (the episode's inputs and
``Step.verify_reads``). The seal records
the stat identity ``(mtime_ns, size, inode)`` of each of those files plus the envelope's
summary, and is written into the step's ledger row in the same transaction as the status.
A read-only judge (the resume sensor, ``storyboard decide``) that finds every identity
unchanged knows the verifier would read the same bytes, so the verdict still holds: a cold
tick costs a few ``stat`` calls per step instead of parsing every envelope and hashing every
image. Any difference (a file deleted, replaced, appended to, touched) voids the seal and
the checkpoint is judged the long way, exactly as a run judges it.

Why identities are enough: our writers replace files by rename (a new inode), and any
in-place write moves mtime, except a write within the same filesystem timestamp tick as
the recorded one. So a file written less than ``RACY_NS`` before sealing is "racily clean"
(git's index has the same problem): its sha256 goes into the seal and the checker hashes
it again. The staged envelope's mtime is set one second into the past when it is written,
so the checkpoint file itself is never racy.

The envelope and artifact identities are taken with ``lstat``: for a regular file they are
the ``stat`` values, and a symlink put in a sealed file's place (even to the very file,
moved elsewhere) has its own inode, so it never matches. A link in a directory on the way
is the store's to catch (``CheckpointStore.sealed``); a file that is a link is never sealed.

Not covered, by design: a verifier reading files it does not declare (its contract, see
``Step.verify_reads``); a rewrite that forges the original mtime_ns; bit rot that changes
bytes without touching metadata; and a verifier whose code changed without a
``Step.verify_revision`` bump (the seal records the revision; another one voids it). Runs
and the IO manager always verify in full; a sensor built with ``trust_seals=False`` does
too. Likewise a symlink planted in the step directory beside the sealed files (in
``archive/``, as the force marker, as a receipt): no sealed verdict reads it, so a holding
seal still SKIPs; the long way and every writer refuse it (``checkpoint.symlink``).
"""

import functools
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from pipeline_defs.resume.decision_types import CheckpointSummary
from pipeline_defs.resume.identity import (
    ABSENT_FILE,
    FileIdentity,
    file_identity,
    is_link,
    own_file_identity,
)
from pipeline_defs.resume.status import StepStatus

SEAL_VERSION = 1
_loads = json.loads
# The compact text form (version 2). A cold sensor tick decodes one seal per ledger row
# (100,000s), and parsing a JSON object per row was a fifth of the tick (BENCHMARKS.md,
# "Sensor tick"). Version 2 puts what the rows of a step share (the verdict: summary,
# artifact names, verifier revision) in one JSON part that is decoded once per distinct
# text, and the per-row part (when, which version, the stat identities) in fields split by
# ASCII separators. Version 1 (one JSON object) still decodes: rows sealed before stay
# trusted; it is also what a seal whose text would contain a separator is written as.
_V2 = "2"
_UNIT, _RECORD, _GROUP = "\x1f", "\x1e", "\x1d"  # between parts, entries, entry fields
_V2_PARTS = 7
RACY_NS = 20_000_000  # two 100 Hz timestamp ticks: a file younger than this at sealing is re-hashed
COARSE_RACY_NS = 2_000_000_000  # filesystems with whole-second timestamps
BACKDATE_NS = 1_000_000_000  # how far a staged checkpoint's mtime is set into the past

# The identities and the seal's absent-read sentinel are the core's
# (pipeline_defs.resume.identity); these names are kept for the modules that import them.
ABSENT: FileIdentity = ABSENT_FILE  # a read that did not exist: its appearance voids the seal
# (mtime_ns, size, inode) of a file or directory, or None when absent. Taken with lstat
# (docs/DESIGN.md#no-escape): an input or read replaced by a link, even to the file moved
# elsewhere, has the link's own identity, so the seal no longer holds and the long way
# reports the link. For regular files and directories it is the ``stat`` identity, so seals
# written before stay valid.
identity_of = file_identity
# Of the entry itself, and None for a link (as if absent): for the files of ours a seal
# covers (the envelope, the artifacts), where a link is never legitimate.
own_identity_of = own_file_identity
_is_link = is_link


def is_racy(identity: FileIdentity, sealed_ns: int) -> bool:
    """Could a same-size rewrite after ``sealed_ns`` keep this mtime? (same timestamp tick)"""
    mtime = identity[0]
    window = COARSE_RACY_NS if mtime % 1_000_000_000 == 0 else RACY_NS
    return mtime > sealed_ns - window


def _sha256(path: str) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


class SealedFile(NamedTuple):
    """One file (or directory) the verdict depends on, relative to ``PIPELINE_HOME``.

    Flat, so the seal's text form decodes straight into it.
    """

    path: str
    mtime_ns: int
    size: int
    ino: int
    sha256: str | None = None  # set for racily clean files: the checker hashes them again

    @property
    def identity(self) -> FileIdentity:
        return (self.mtime_ns, self.size, self.ino)


@functools.lru_cache(maxsize=4096)
def _summary(
    schema_version: int,
    status: StepStatus,
    config_hash: str,
    fingerprints: tuple[tuple[str, str], ...],
) -> CheckpointSummary:
    """Shared summaries: a cold tick decodes 100,000 seals with a handful of distinct ones."""
    return CheckpointSummary(
        present=True,
        schema_version=schema_version,
        status=status,
        config_hash=config_hash,
        config_fingerprints=MappingProxyType(dict(fingerprints)),  # shared: read-only
    )


# The summaries of decoded seals by their raw JSON values, so a seal whose verdict fields
# were seen before costs one dict lookup instead of a sort, conversions and an lru_cache
# call (BENCHMARKS.md, "Sensor tick": ~3 us of a seal's ~16 us decode). Bounded: cleared
# when full; a handful of distinct verdicts per step is the usual count.
_RAW_SUMMARIES: dict[tuple[Any, ...], CheckpointSummary] = {}
_RAW_SUMMARIES_MAX = 4096


def summary_of(
    schema_version: Any, status: Any, config_hash: Any, fingerprints: Mapping[Any, Any]
) -> CheckpointSummary:
    """The shared summary of a decoded seal's raw values (disk or object storage).

    Raises ``ValueError``/``TypeError`` for values of the wrong type (an unhashable or
    non-numeric value in a tampered seal): the caller judges that row the long way.
    """
    key = (schema_version, status, config_hash, *fingerprints.items())
    found = _RAW_SUMMARIES.get(key)
    if found is None:
        found = _summary(
            int(schema_version),
            StepStatus(str(status)),  # not a status (a tampered seal): ValueError
            str(config_hash),
            tuple(sorted((str(k), str(v)) for k, v in fingerprints.items()))
            if fingerprints
            else (),
        )
        if len(_RAW_SUMMARIES) >= _RAW_SUMMARIES_MAX:
            _RAW_SUMMARIES.clear()
        _RAW_SUMMARIES[key] = found
    return found


def _status_text(summary: CheckpointSummary) -> str | None:
    # The text, never the member: a seal's bytes are compared and hashed as written.
    return summary.status.value if summary.status is not None else None


def verdict_fields(
    summary: CheckpointSummary,
    version: str,
    artifacts: Sequence[str],
    sealed_ns: int,
    revision: int,
) -> dict[str, Any]:
    """What every seal's text holds of the verdict, whatever it names the files by (a disk
    seal by stat identities, an object seal by e_tags and pointers)."""
    return {
        "at": sealed_ns,
        "sv": summary.schema_version,
        "st": _status_text(summary),
        "ch": summary.config_hash,
        "fp": dict(summary.config_fingerprints),
        "ver": version,
        "art": list(artifacts),
        "vr": revision,
    }


# A SealedFile's fields as a plain tuple: what a decoded seal holds (cheaper to build).
SealedEntry = tuple[str, int, int, int, str | None]


def _files(raw: Any) -> tuple[SealedEntry, ...]:
    # No conversions: a value of the wrong type simply never equals a stat identity (or a
    # sha256), so a tampered seal fails closed, i.e. is judged the long way.
    files = tuple(map(tuple, raw))
    if files and (min(map(len, files)) != 5 or max(map(len, files)) != 5):
        raise ValueError("a sealed file is [path, mtime_ns, size, ino, sha256]")
    return files


def _entries_text(entries: Sequence[SealedEntry]) -> str:
    return _RECORD.join(
        _GROUP.join((path, str(mtime_ns), str(size), str(ino), sha256 or ""))
        for path, mtime_ns, size, ino, sha256 in entries
    )


def _entries(text: str) -> tuple[SealedEntry, ...]:
    # A wrong field count raises ValueError (unpacking), a non-number too (int): the row is
    # then judged the long way.
    if not text:
        return ()
    out: list[SealedEntry] = []
    for entry in text.split(_RECORD):
        path, mtime_ns, size, ino, sha256 = entry.split(_GROUP)
        out.append((path, int(mtime_ns), int(size), int(ino), sha256 or None))
    return tuple(out)


# The verdict parts of version 2 seals, decoded once per distinct text: the rows of one
# step under one project config share it. Bounded: cleared when full.
_VERDICTS: dict[str, tuple[CheckpointSummary, tuple[str, ...], int]] = {}


def _verdict(text: str) -> tuple[CheckpointSummary, tuple[str, ...], int]:
    found = _VERDICTS.get(text)
    if found is None:
        raw = _loads(text)
        if type(raw) is not dict or type(raw["fp"]) is not dict:
            raise ValueError("a seal's verdict is a JSON object with fingerprints")
        found = (
            summary_of(raw["sv"], raw["st"], raw["ch"], raw["fp"]),
            tuple(map(str, raw["art"])),
            int(raw["vr"]),
        )
        if len(_VERDICTS) >= _RAW_SUMMARIES_MAX:
            _VERDICTS.clear()
        _VERDICTS[text] = found
    return found


def _matches(
    home: str, files: tuple[SealedEntry, ...], identity: Callable[[str], FileIdentity | None]
) -> bool:
    for path, mtime_ns, size, ino, sha256 in files:
        full = f"{home}/{path}"
        if (identity(full) or ABSENT) != (mtime_ns, size, ino):
            return False
        if sha256 is not None and _sha256(full) != sha256:
            return False
    return True


@dataclass(frozen=True)
class Seal:
    """What a read-only judge needs of a clean, published checkpoint, without reading it."""

    checkpoint: FileIdentity
    summary: CheckpointSummary
    version: str  # created_at|run_id|mutations: which version of the envelope (run keys)
    artifacts: tuple[str, ...]  # artifact paths relative to the step directory
    files: tuple[SealedEntry, ...]  # the artifacts' files (SealedFile fields)
    reads: tuple[SealedEntry, ...]  # episode inputs, Step.verify_reads
    sealed_ns: int
    revision: int = 1  # the step's verify_revision when it was verified

    def paths(self) -> tuple[str, ...]:
        """Every file and directory the seal covers, relative to ``PIPELINE_HOME``."""
        return tuple(entry[0] for entry in (*self.files, *self.reads))

    # ------------------------------------------------------------------ text form
    def encode(self) -> str:
        """The compact form (version 2); version 1 if a field holds a separator."""
        verdict = json.dumps(
            {
                "sv": self.summary.schema_version,
                "st": _status_text(self.summary),
                "ch": self.summary.config_hash,
                "fp": dict(self.summary.config_fingerprints),
                "art": list(self.artifacts),
                "vr": self.revision,
            },
            separators=(",", ":"),
            sort_keys=True,
        )  # JSON escapes the separators inside it
        texts = [self.version]
        for entry in (*self.files, *self.reads):
            texts.append(entry[0])
            texts.append(entry[4] or "")
        if any(sep in t for t in texts for sep in (_UNIT, _RECORD, _GROUP)):
            return self.encode_v1()
        return _UNIT.join(
            (
                _V2,
                verdict,
                str(self.sealed_ns),
                self.version,
                ",".join(map(str, self.checkpoint)),
                _entries_text(self.files),
                _entries_text(self.reads),
            )
        )

    def encode_v1(self) -> str:
        """The version 1 form (one JSON object), as runs wrote it before version 2."""
        return json.dumps(
            {
                "v": SEAL_VERSION,
                **verdict_fields(
                    self.summary, self.version, self.artifacts, self.sealed_ns, self.revision
                ),
                "cp": list(self.checkpoint),
                "af": [list(f) for f in self.files],
                "rf": [list(f) for f in self.reads],
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def decode(cls, text: Any) -> "Seal | None":
        """The seal, or None for no / unreadable / other-version text (= judge the long way).

        A cold tick decodes one per ledger row (100,000s), so the instance is filled in one
        go (as ``LedgerRow.from_row`` is) instead of through the frozen ``__init__``.
        """
        if type(text) is not str or not text:
            return None
        try:
            if text[0] == _V2:
                return cls._decode_v2(text)
            raw = _loads(text)
            if type(raw) is not dict or raw.get("v") != SEAL_VERSION:
                return None
            cp = raw["cp"]
            fingerprints = raw["fp"]
            if type(fingerprints) is not dict:
                return None
            return cls._filled(
                checkpoint=(int(cp[0]), int(cp[1]), int(cp[2])),
                summary=summary_of(raw["sv"], raw["st"], raw["ch"], fingerprints),
                version=str(raw["ver"]),
                artifacts=tuple(map(str, raw["art"])),
                files=_files(raw["af"]),
                reads=_files(raw["rf"]),
                sealed_ns=int(raw["at"]),
                revision=int(raw["vr"]),
            )
        except (ValueError, TypeError, KeyError, IndexError):
            return None

    @classmethod
    def _decode_v2(cls, text: str) -> "Seal | None":
        parts = text.split(_UNIT)
        if len(parts) != _V2_PARTS or parts[0] != _V2:
            return None
        _, verdict, sealed_ns, version, checkpoint, files, reads = parts
        summary, artifacts, revision = _verdict(verdict)
        mtime_ns, size, ino = checkpoint.split(",")
        return cls._filled(
            checkpoint=(int(mtime_ns), int(size), int(ino)),
            summary=summary,
            version=version,
            artifacts=artifacts,
            files=_entries(files),
            reads=_entries(reads),
            sealed_ns=int(sealed_ns),
            revision=revision,
        )

    @classmethod
    def _filled(cls, **fields: Any) -> "Seal":
        # Filled in one go instead of through the frozen __init__ (one __setattr__ per
        # field): a cold tick decodes one seal per ledger row.
        made = object.__new__(cls)
        made.__dict__.update(fields)
        return made

    # ------------------------------------------------------------------ checking
    def holds(
        self,
        home: str,
        checkpoint_path: str,
        shared: Callable[[str], FileIdentity | None] = identity_of,
    ) -> bool:
        """Every sealed file still has its identity (and racy ones their sha256).

        ``shared``: how to stat the reads (a caller judging every step of an episode passes
        a memo, so the inputs all its steps share are stat'ed once).
        """
        return (
            own_identity_of(checkpoint_path) == self.checkpoint
            and _matches(home, self.files, own_identity_of)
            and _matches(home, self.reads, shared)
        )


def make_seal(
    *,
    home: Path,
    checkpoint_file: Path,
    summary: CheckpointSummary,
    version: str,
    artifacts: Mapping[str, str],
    reads: Sequence[Path],
    sealed_ns: int,
    expected: FileIdentity | None = None,
    revision: int = 1,
) -> Seal | None:
    """Seal of a verified checkpoint; None when a file is missing or the envelope is racy.

    ``artifacts`` maps each artifact's path relative to the step directory to its recorded
    sha256; ``reads`` are the other files and directories the step's verifier may read;
    ``expected``: the envelope's identity when it was read and verified, if not staged.
    """
    if _is_link(checkpoint_file):
        return None  # never seal a link (the store refuses it as checkpoint.symlink)
    identity = own_identity_of(checkpoint_file)
    if identity is None or is_racy(identity, sealed_ns):
        return None
    if expected is not None and identity != expected:
        return None  # the envelope changed since it was verified
    step_dir = checkpoint_file.parent
    files: list[SealedFile] = []
    reads_found: list[SealedFile] = []
    wanted: list[tuple[Path, str | None, bool]] = [
        (step_dir / rel, sha, True) for rel, sha in artifacts.items()
    ]
    wanted += [(Path(path), None, False) for path in reads]
    for path, recorded, required in wanted:
        try:
            relative = path.resolve().relative_to(home.resolve()).as_posix()
        except ValueError:
            return None  # outside PIPELINE_HOME: not sealable, judged the long way
        if required and _is_link(path):
            return None  # an artifact of ours that is a link is not sealable
        found = own_identity_of(path) if required else identity_of(path)
        if found is None:
            if required:
                return None
            reads_found.append(SealedFile(relative, *ABSENT))
            continue
        sha: str | None = None
        if is_racy(found, sealed_ns):
            if path.is_dir():
                return None  # an entry may change within the tick unseen; nothing to hash
            sha = recorded or _sha256(str(path))
            if sha is None:
                return None
        (files if required else reads_found).append(SealedFile(relative, *found, sha))
    return Seal(
        checkpoint=identity,
        summary=summary,
        version=version,
        artifacts=tuple(artifacts),
        files=tuple(files),
        reads=tuple(reads_found),
        sealed_ns=sealed_ns,
        revision=revision,
    )
