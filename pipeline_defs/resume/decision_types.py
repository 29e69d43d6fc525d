"""The judge's vocabulary: what ``decide`` (:mod:`pipeline_defs.resume.decision`, the table)
reads and what it says.

What it reads, gathered by the caller (the judge does no I/O): :class:`JudgedStep` (the part of
a step spec it reads), :class:`CheckpointSummary` (the envelope's fields), :class:`ScopedConfig`
(the scoped config's fingerprints, :func:`fingerprint` and :func:`config_hash` shared with the
checkpoint writer) and :class:`InTheWay` (what stands where a claiming run would write). What it
says: :class:`ResumeAction` (``CLAIMING_ACTIONS``), for a :class:`LaunchMode`, as a
:class:`ResumeDecision` whose impossible combinations are refused; a BLOCK carries one of
``BLOCK_CODES`` (docs/DESIGN.md#decision-table).
"""

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from pipeline_defs.resume.budget import CODE_BUDGET_EXHAUSTED
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.status import StepStatus

CODE_RESUME_BLOCKED = "step.resume_blocked"
CODE_VERIFY_CRASHED = "step.verify_crashed"
CODE_RECOVERY_EXHAUSTED = "step.recovery_exhausted"
# Row 6: another run holds a healthy lease. A run that meets it fails exactly like a run
# that lost the claim race, so the user sees one outcome whichever way the race went.
CODE_ALREADY_RUNNING = "step.already_running"
BLOCK_CODES = frozenset(
    {
        CODE_RESUME_BLOCKED,
        CODE_VERIFY_CRASHED,
        CODE_RECOVERY_EXHAUSTED,
        CODE_ALREADY_RUNNING,
        CODE_BUDGET_EXHAUSTED,
    }
)

FORCE_HINT = "launch with tag resume/mode=force to rebuild"
# Row 3's reason. A first run is a RERUN_SELF (it claims and runs like one) but re-runs
# nothing: operator views show it as "first run", and find it in audit rows by this text.
FIRST_RUN_REASON = "first run"
# What operators read for it (run metadata, logs, status views): not "rerun_self".
FIRST_RUN_LABEL = "first_run"


class ResumeAction(StrEnum):
    """What the run (or the sensor) does with a step."""

    SKIP = "skip"
    RERUN_SELF = "rerun_self"
    FORCE_EXPLICIT = "force_explicit"
    REDRAW_EXPLICIT = "redraw_explicit"
    STALE_RUNNING_RECOVERY = "stale_running_recovery"
    BLOCK = "block"
    NOT_APPLICABLE = "not_applicable"


CLAIMING_ACTIONS = frozenset(
    {
        ResumeAction.RERUN_SELF,
        ResumeAction.FORCE_EXPLICIT,
        ResumeAction.REDRAW_EXPLICIT,
        ResumeAction.STALE_RUNNING_RECOVERY,
    }
)


class LaunchMode(StrEnum):
    """``force`` only ever comes from an explicit human/API request; everything else resumes."""

    RESUME = "resume"
    FORCE = "force"
    # Explicit redraw of chosen items (tag resume/redraw): judged as a resume, then claims
    # where a resume would skip or rerun; a block or a running owner still stops it.
    REDRAW = "redraw"
    # Keep hand edits (tag resume/mode=accept, docs/DESIGN.md#hand-edits). Never judged: the
    # asset factory accepts a step's edit instead of running it, or runs the step in mode
    # resume; were it passed here, it would be judged as a resume (it forces nothing).
    ACCEPT = "accept"


class JudgedStep(Protocol):
    """The part of a step spec the judge reads (read-only, so frozen specs qualify)."""

    @property
    def step_id(self) -> str: ...

    @property
    def schema_version(self) -> int: ...

    @property
    def resume_config_keys(self) -> tuple[str, ...]: ...

    @property
    def allow_auto_rerun_on_schema_bump(self) -> bool: ...


@dataclass(frozen=True)
class CheckpointSummary:
    """The envelope fields the judge needs, read by the caller (the judge does no I/O)."""

    present: bool
    schema_version: int | None = None
    status: StepStatus | None = None
    config_hash: str | None = None
    config_fingerprints: Mapping[str, str] = field(default_factory=dict)
    # Present but unreadable or tampered (corrupt JSON, no or a wrong content_hash, not a
    # regular file): the verifier reports how; the other fields are placeholders.
    unusable: bool = False

    @classmethod
    def absent(cls) -> "CheckpointSummary":
        """No checkpoint on disk."""
        return cls(present=False)


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def fingerprint(value: Any) -> str:
    """Fingerprint of one config value (sha256 of canonical JSON), so writers agree."""
    return hashlib.sha256(_canonical_json(value).encode("utf-8")).hexdigest()


def config_hash(fingerprints: Mapping[str, str]) -> str:
    """Hash of the scoped config: sha256 hex of canonical JSON of the sorted fingerprints."""
    ordered = {str(k): str(v) for k, v in sorted(fingerprints.items())}
    return hashlib.sha256(_canonical_json(ordered).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ScopedConfig:
    """Current fingerprints of the step's ``resume_config_keys`` (dotted key -> fingerprint)."""

    fingerprints: Mapping[str, str] = field(default_factory=dict)

    @property
    def hash(self) -> str:
        """Same function the checkpoint writer uses, so equal configs compare equal."""
        return config_hash(self.fingerprints)


@dataclass(frozen=True)
class ResumeDecision:
    """The judge's verdict; impossible combinations are refused so callers can trust flags."""

    action: ResumeAction
    reason: str
    origin: Origin | None = None
    code: str | None = None
    expected_started_at: str | None = None
    expected_run_id: str | None = None
    # A lease steal is also a compare-and-set on the heartbeat the judge saw: an owner
    # that renewed since is alive and keeps its row.
    expected_heartbeat_at: str | None = None
    first_run: bool = False
    adopt: bool = False
    auto_recovery: bool = False
    deferred_until: str | None = None

    def __post_init__(self) -> None:
        action = ResumeAction(self.action)
        object.__setattr__(self, "action", action)
        if self.origin is not None:
            object.__setattr__(self, "origin", Origin(self.origin))
        if action is ResumeAction.BLOCK:
            if self.code not in BLOCK_CODES:
                raise ValueError(f"a BLOCK needs one of {sorted(BLOCK_CODES)}, got {self.code!r}")
        elif self.code is not None:
            raise ValueError(f"only a BLOCK carries a code, got {self.code!r} on {action.value}")
        if action not in CLAIMING_ACTIONS:
            expected = (self.expected_started_at, self.expected_run_id, self.expected_heartbeat_at)
            if any(e is not None for e in expected):
                raise ValueError(f"{action.value} claims nothing and carries no expected_* fields")
            if self.auto_recovery or self.deferred_until is not None:
                raise ValueError(f"{action.value} is not an automatic recovery")
        if self.first_run and action is not ResumeAction.RERUN_SELF:
            raise ValueError("first_run only applies to RERUN_SELF")
        if self.adopt and action is not ResumeAction.SKIP:
            raise ValueError("adopt only applies to SKIP")
        if self.deferred_until is not None and not self.auto_recovery:
            raise ValueError("only automatic recoveries are deferred")

    @property
    def label(self) -> str:
        """The decision as people read it: a first run is ``first_run``, not a re-run."""
        return FIRST_RUN_LABEL if self.first_run else self.action.value

    @property
    def claims(self) -> bool:
        """Whether acting on this decision claims the ledger row."""
        return self.action in CLAIMING_ACTIONS

    @property
    def is_block(self) -> bool:
        """Whether the step is blocked (the run raises ``code``, the sensor reports it)."""
        return self.action is ResumeAction.BLOCK


@dataclass(frozen=True)
class InTheWay:
    """What may stand where a run of the step would write: facts the reader gathers.

    ``unreadable``: the error that kept the step's checkpoint from loading, if any; a link
    where our file should be (``checkpoint.symlink``) blocks whatever the row says
    (docs/DESIGN.md#no-escape). ``probe(action, auto_recovery)``: for a decision that would
    claim the step, something in its write path (a link in a directory it would write, a
    directory or FIFO where an artifact goes, an older copy of an artifact put back by hand
    that an automatic re-run would adopt), or None. Called at most once, lazily, as
    ``verify`` is: the probes read the file system and are not needed otherwise.
    """

    unreadable: PipelineError | None = None
    probe: Callable[[ResumeAction, bool], PipelineError | None] | None = None
