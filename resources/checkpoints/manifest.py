"""The commit pointer of a checkpoint on object storage: which immutable objects it is.

On a bucket nothing is renamed and nothing is overwritten: a run writes its envelope and
artifacts as new objects under a prefix of its own attempt, and *publishes* by one
owner-aware ledger update that stores this manifest in its row (the pattern of Iceberg's
JDBC catalog and lakeFS). The manifest names every object by key, size, sha256 and the
store's ``e_tag``/``version``, so:

- a read verifies what it reads against it (an object deleted, overwritten or replaced by
  an older copy is told apart from the published one);
- it is the seal: an unchanged row is judged from the ledger alone, with no request; a
  budgeted scrub (one LIST per episode prefix) compares the bucket with the manifests;
- garbage collection keeps every prefix a manifest names (an image step reuses valid
  pictures of an earlier attempt by naming them, copy-free).

Pure: no I/O. Encoded as canonical JSON (sorted keys), versioned by ``v``.
"""

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.layout import CHECKPOINT_FILE
from pipeline_defs.resume.partition import StepKey

MANIFEST_VERSION = 1
ENVELOPE_NAME = CHECKPOINT_FILE  # an attempt's envelope object, named as on disk
COMPANIONS_NAME = "companions.json"  # an attempt's files named after its artifacts, bundled


def encode_companions(files: Mapping[str, bytes]) -> bytes:
    """The companion files of an attempt (relative path -> bytes) as one object."""
    bundle = {p: base64.b64encode(data).decode("ascii") for p, data in sorted(files.items())}
    return json.dumps({"v": 1, "files": bundle}, sort_keys=True).encode("utf-8")


def decode_companions(payload: bytes) -> dict[str, bytes]:
    """The files of a companions object; empty when it is not one (nothing to reuse)."""
    try:
        raw = json.loads(payload)
        files = raw["files"] if isinstance(raw, Mapping) and raw.get("v") == 1 else {}
        return {str(p): base64.b64decode(str(d), validate=True) for p, d in files.items()}
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
        return {}


@dataclass(frozen=True)
class ObjectRef:
    """One immutable object as published: where it is and what its bytes are."""

    key: str
    size: int
    sha256: str
    e_tag: str | None = None
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "size": self.size, "sha256": self.sha256}
        if self.e_tag is not None:
            out["e_tag"] = self.e_tag
        if self.version is not None:
            out["version"] = self.version
        return out

    @classmethod
    def from_dict(cls, raw: Any, *, where: str) -> "ObjectRef":
        if not isinstance(raw, Mapping):
            raise _invalid(where, "an object reference is not a mapping")
        key, size, digest = raw.get("key"), raw.get("size"), raw.get("sha256")
        if not isinstance(key, str) or not key:
            raise _invalid(where, "an object reference has no key")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _invalid(where, f"{key}: size is not a non-negative integer")
        if not isinstance(digest, str) or len(digest) != 64:
            raise _invalid(where, f"{key}: sha256 is not a 64-character hex digest")
        e_tag, version = raw.get("e_tag"), raw.get("version")
        if e_tag is not None and not isinstance(e_tag, str):
            raise _invalid(where, f"{key}: e_tag is not text")
        if version is not None and not isinstance(version, str):
            raise _invalid(where, f"{key}: version is not text")
        return cls(key, size, digest, e_tag, version)

    def same_object(self, size: int, e_tag: str | None, version: str | None) -> bool:
        """Is a listed/headed object the published one? Size always; the version where the
        bucket has versions (an overwrite makes a new one); else the e_tag."""
        if size != self.size:
            return False
        if self.version is not None and version is not None:
            return version == self.version
        return self.e_tag is None or e_tag == self.e_tag


@dataclass(frozen=True)
class Manifest:
    """What a published checkpoint is: its attempt, envelope and artifacts."""

    step: StepKey
    attempt: str
    envelope: ObjectRef
    content_hash: str
    artifacts: Mapping[str, ObjectRef] = field(default_factory=dict)
    # The files named after an artifact (``C01.png.receipt.json``), in one object: what a
    # re-run that lost the envelope reads to reuse a picture, as beside it on a local home.
    companions: ObjectRef | None = None

    @property
    def keys(self) -> frozenset[str]:
        """Every object key this manifest names (what gc must keep)."""
        named = [self.envelope, *self.artifacts.values()]
        if self.companions is not None:
            named.append(self.companions)
        return frozenset(ref.key for ref in named)

    def encode(self) -> str:
        raw: dict[str, Any] = {
            "v": MANIFEST_VERSION,
            "step": [self.step.project_id, self.step.episode_id, self.step.step_id],
            "attempt": self.attempt,
            "envelope": self.envelope.to_dict(),
            "content_hash": self.content_hash,
            "artifacts": {p: r.to_dict() for p, r in sorted(self.artifacts.items())},
        }
        if self.companions is not None:  # absent, the manifest reads as before
            raw["companions"] = self.companions.to_dict()
        return json.dumps(raw, sort_keys=True, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str, *, where: str = "the ledger row") -> "Manifest":
        """The manifest in ``text``; a typed ``checkpoint.invalid`` naming what is wrong."""
        try:
            raw = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise _invalid(where, f"the manifest is not JSON ({exc})") from None
        if not isinstance(raw, Mapping) or raw.get("v") != MANIFEST_VERSION:
            raise _invalid(where, f"the manifest is not version {MANIFEST_VERSION}")
        step = raw.get("step")
        if not (
            isinstance(step, list) and len(step) == 3 and all(isinstance(s, str) for s in step)
        ):
            raise _invalid(where, "the manifest names no step")
        attempt, content_hash = raw.get("attempt"), raw.get("content_hash")
        if not isinstance(attempt, str) or not attempt:
            raise _invalid(where, "the manifest names no attempt")
        if not isinstance(content_hash, str) or len(content_hash) != 64:
            raise _invalid(where, "the manifest has no content_hash")
        artifacts = raw.get("artifacts")
        if not isinstance(artifacts, Mapping):
            raise _invalid(where, "the manifest's artifacts are not a mapping")
        companions = raw.get("companions")
        return cls(
            StepKey(*step),
            attempt,
            ObjectRef.from_dict(raw.get("envelope"), where=where),
            content_hash,
            {str(p): ObjectRef.from_dict(r, where=where) for p, r in artifacts.items()},
            None if companions is None else ObjectRef.from_dict(companions, where=where),
        )


def _invalid(where: str, problem: str) -> PipelineError:
    return PipelineError(
        ErrorCode.CHECKPOINT_INVALID,
        f"checkpoint manifest in {where}: {problem}",
        origin=Origin.CONTRACT_DRIFT.value,
        details={"where": where},
    )
