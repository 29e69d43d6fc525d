"""Seals of checkpoints published on object storage: judged from the ledger, no request.

On a local disk a seal records the stat identities of the files a run verified
(:mod:`resources.checkpoints.seal`); another process re-checks them with ``lstat``. On a
bucket the files a process holds are its own scratch copy, so those identities mean
nothing to any other machine. What does travel is the ledger row:

- **The checkpoint and its artifacts** are the row's pointer (the manifest). The seal is
  written in the same transaction as the pointer, and every other change of the pointer
  (a compare-and-set of the review, a force, a migration) rewrites or clears it, so a
  seal in a row always speaks of that row's pointer: nothing to compare.
- **The inputs** the verifier read (the episode's input files) are recorded by the
  ``e_tag`` of the published object the run verified a copy of; **the victims** a
  mutator's verifier reads by the sha256 of their pointers.

A judge trusts such a seal unless it knows better: a process that has seen another
``e_tag`` for an input, or another pointer for a victim, or whose scrub found the
published objects drifted (deleted, replaced), judges the long way. Drift in the bucket
(an object deleted or overwritten behind the ledger's back) is found by the budgeted scrub
(:mod:`pipeline_defs.judging.scrub`: one LIST per episode prefix per
``PIPELINE_SCRUB_PERIOD_SECONDS``), which clears the seals it finds broken, so every
process then judges those steps the long way. Runs and the IO manager always verify in
full. Pure: no I/O.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline_defs.resume.decision_types import CheckpointSummary
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.seal import ABSENT, Seal, summary_of, verdict_fields

OBJECT_SEAL_VERSION = "object/1"


@dataclass(frozen=True)
class ObjectSeal:
    """What a read-only judge needs of a clean checkpoint published on object storage."""

    summary: CheckpointSummary
    version: str  # created_at|run_id|mutations of the envelope (run keys)
    artifacts: tuple[str, ...]  # artifact paths relative to the step directory
    inputs: Mapping[str, str]  # input object key -> e_tag of the copy the run verified
    victims: Mapping[str, str]  # victim step id -> sha256 of its pointer when verified
    sealed_ns: int
    revision: int = 1

    def as_seal(self) -> Seal:
        """The judge's view: the same summary, version and artifacts as a disk seal."""
        return Seal(
            checkpoint=ABSENT,
            summary=self.summary,
            version=self.version,
            artifacts=self.artifacts,
            files=(),
            reads=(),
            sealed_ns=self.sealed_ns,
            revision=self.revision,
        )

    def encode(self) -> str:
        return json.dumps(
            {
                "v": OBJECT_SEAL_VERSION,
                **verdict_fields(
                    self.summary, self.version, self.artifacts, self.sealed_ns, self.revision
                ),
                "in": dict(self.inputs),
                "vic": dict(self.victims),
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def decode(cls, text: Any) -> "ObjectSeal | None":
        """The seal, or None for no / unreadable / other text (a disk seal included: its
        identities name another machine's files; the step is judged the long way)."""
        if not isinstance(text, str) or not text.startswith("{"):
            return None
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict) or raw.get("v") != OBJECT_SEAL_VERSION:
                return None
            fingerprints, inputs, victims = raw["fp"], raw["in"], raw["vic"]
            if not all(isinstance(m, dict) for m in (fingerprints, inputs, victims)):
                return None
            return cls(
                summary=summary_of(int(raw["sv"]), str(raw["st"]), str(raw["ch"]), fingerprints),
                version=str(raw["ver"]),
                artifacts=tuple(map(str, raw["art"])),
                inputs={str(k): str(v) for k, v in inputs.items()},
                victims={str(k): str(v) for k, v in victims.items()},
                sealed_ns=int(raw["at"]),
                revision=int(raw["vr"]),
            )
        except (ValueError, TypeError, KeyError):
            return None


@dataclass(frozen=True)
class SealDrift:
    """A step whose seal no longer speaks for the storage, as a scrub found it."""

    step: StepKey
    seal: str  # the seal text found broken (a caller clears exactly this one)
    why: str
