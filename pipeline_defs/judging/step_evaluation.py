"""What a batch judgement says of one (step, partition): the facts a decision was made
from (:class:`Facts`), the sensor's verdict (:class:`Verdict`) and the evaluation itself
(:class:`StepEvaluation`: run key, block signature, the operator's way out). Dagster-free.
"""

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from pipeline_defs.resume.budget import CODE_BUDGET_EXHAUSTED, way_out_of
from pipeline_defs.resume.clock import parse_timestamp
from pipeline_defs.resume.decision_types import (
    CODE_ALREADY_RUNNING,
    CODE_RECOVERY_EXHAUSTED,
    CODE_VERIFY_CRASHED,
    ResumeAction,
    ResumeDecision,
)
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.identity import (
    ABSENT,
    Identity,
)
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from pipeline_defs.resume.way_out import recovery_way_out
from resources.checkpoints.envelope import EDITED_OUTSIDE

UNJUDGEABLE = "cannot be judged"

# The ledger columns a judgement reads (decide, run keys, wake times, seals): bulk readers
# fetch only these.
JUDGED_COLUMNS = (
    "status",
    "run_id",
    "started_at",
    "updated_at",
    "heartbeat_at",
    "recovery_count",
    "last_recovery_reason",
    "retry_not_before",
    "checkpoint_seal",
)
LAUNCH_ACTIONS = frozenset({ResumeAction.RERUN_SELF, ResumeAction.STALE_RUNNING_RECOVERY})
RUN_KEY_PREFIX = "resume"


# One partition's ledger rows by step id, each with its key as the ledger store built it.
PartitionRows = Mapping[str, tuple[StepKey, LedgerRow]]


# The detail of a step that waits on a blocked upstream step (named after it).
BLOCKED_UPSTREAM = "waits on blocked upstream"


@dataclass(frozen=True)
class Outage:
    """An outage met while judging a partition (``errors.OUTAGES``: the storage or the
    ledger out of reach, its retries spent). It says nothing of the partition's steps, so
    it gets no verdict: the partition is deferred whole (no evaluation, no launch, no
    report) and judged again on the next tick. Plain text, so it crosses process pools."""

    code: str
    message: str

    @classmethod
    def of(cls, exc: PipelineError) -> "Outage":
        return cls(str(exc.code), exc.message)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class Verdict(StrEnum):
    """What the sensor does with one (step, partition) this tick."""

    LAUNCH = "launch"
    DEFERRED = "deferred"
    WAITING = "waiting"
    # Another run holds a live lease on it: no fault and nothing to do. The judge's answer is
    # its BLOCK with ``step.already_running``; no surface counts or reports it as a block.
    RUNNING = "running"
    BLOCKED = "blocked"
    SKIP = "skip"
    NOT_APPLICABLE = "not_applicable"


class Facts(NamedTuple):
    """The observed state a decision was made from (what a run key is derived from).

    A named tuple: a cold tick builds one per (step, partition), 100,000s of them.
    """

    status: str | None = None
    run_id: str | None = None
    started_at: str | None = None
    updated_at: str | None = None
    recovery_count: int = 0
    retry_not_before: str | None = None
    checkpoint: str | None = None
    directory: Identity = ABSENT

    @classmethod
    def observe(cls, row: LedgerRow | None, seen: str | None, directory: Identity) -> "Facts":
        """``seen``: which checkpoint version (``Checkpoint.version``) or breakage was judged."""
        if row is None:
            return cls(checkpoint=seen, directory=tuple(directory))
        return cls(
            _text(row.status),
            _text(row.run_id),
            _text(row.started_at),
            _text(row.updated_at),
            row.recovery_count,
            _text(row.retry_not_before),
            seen,
            tuple(directory),
        )

    def digest(self, *extra: object) -> str:
        payload = json.dumps([*extra, *self], default=str)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:20]


def _text(value: Any) -> str | None:
    # A StepStatus becomes its plain text: facts are hashed into run keys as JSON.
    return value if value is None or type(value) is str else str(value)


_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class StepEvaluation:
    """The judge's decision for one (step, partition) plus what the sensor does with it."""

    step_id: str
    partition_key: str
    decision: ResumeDecision
    verdict: Verdict
    detail: str
    facts: Facts = field(default_factory=Facts)
    waits_on: tuple[str, ...] = ()
    upstream: tuple[Facts, ...] = ()  # the upstream steps' states (transitive, same partition)
    after: tuple[str, ...] = ()  # a launch: the upstream steps of the same run it waits on
    # A launch in a run of several steps: that run's key (one per partition and tick).
    run: str | None = None

    @property
    def slot(self) -> str:
        """``step|partition``: how the sensor's cursor names a (step, partition)."""
        return f"{self.step_id}|{self.partition_key}"

    @property
    def launch(self) -> bool:
        """Whether the sensor requests a run for it this tick."""
        return self.verdict is Verdict.LAUNCH

    @property
    def state(self) -> str:
        """Digest of the decision and the state that caused it.

        The upstream steps' states are part of it: a launch that failed before claiming
        (e.g. its upstream changed under it) is launched again once the upstream settles.
        """
        decision = self.decision
        return self.facts.digest(
            decision.action.value,
            decision.expected_started_at,
            decision.expected_run_id,
            decision.expected_heartbeat_at,  # a lease that lapses again is a new state
            *(facts.digest() for facts in self.upstream),
        )

    @property
    def run_key(self) -> str | None:
        """Dedupe key of the launch: same steps, partition and causing states → same key.

        A run of one step keeps the self-only key ``resume:<step>:<partition>:<state>``.
        """
        if self.run is not None:
            return self.run
        if self.decision.action not in LAUNCH_ACTIONS:
            return None
        return f"{RUN_KEY_PREFIX}:{self.step_id}:{self.partition_key}:{self.state}"

    @property
    def run_state(self) -> str:
        """``resume/state`` of the run it goes in: the digest that ends its run key."""
        return self.run.rsplit(":", 1)[1] if self.run is not None else self.state

    @property
    def block_signature(self) -> str | None:
        """Stable identity of a block (volatile numbers such as elapsed seconds masked)."""
        decision = self.decision
        if not decision.is_block:
            return None
        facts = self.facts
        payload = json.dumps(
            [
                decision.code,
                decision.origin.value if decision.origin else None,
                _NUMBERS.sub("#", decision.reason),
                facts.status,
                facts.run_id,
                facts.started_at,
                facts.checkpoint,
            ]
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:12]

    @property
    def what_to_do(self) -> str:
        """Operator hint for a block (empty for anything else)."""
        decision = self.decision
        if not decision.is_block:
            return ""
        where = f"--partition {self.partition_key} --step {self.step_id}"
        force = (
            f"launch with tag resume/mode=force (storyboard force {where}); "
            "downstream checkpoints are invalidated"
        )
        facts = self.facts
        if decision.code == CODE_BUDGET_EXHAUSTED:  # a force would pay too: raise the cap
            return way_out_of(decision.reason)
        if decision.code == CODE_RECOVERY_EXHAUSTED:  # a running row needs a reset first
            key = Episode.parse(self.partition_key).step(self.step_id)
            return recovery_way_out(key, facts.status, facts.run_id, facts.started_at)
        if decision.reason.startswith(UNJUDGEABLE):
            # An invalid project.yaml or the like: every run, forced or not, fails the same way.
            _, code, message = [*decision.reason.split(": ", 2), "", ""][:3]
            what = "the project file" if code == "config.invalid" else "what the reason names"
            return (
                f"fix {what}: {message}. The next sensor tick judges it again; a force cannot "
                "help (every run reads the same input)"
            )
        if decision.code == CODE_VERIFY_CRASHED:
            return (
                f"fix the crashing verifier of {self.step_id} (a code bug); the next tick "
                f"re-judges it. To rebuild instead: {force}"
            )
        if facts.status == StepStatus.RUNNING:
            reset = f"storyboard reset-running {where}"
            if parse_timestamp(facts.started_at) is None:
                expected = (
                    "--null-started-at"
                    if facts.started_at is None
                    else f"--expected-started-at {facts.started_at!r}"
                )
                return (
                    f"manual investigation required: is run {facts.run_id!r} alive? "
                    f"If not: {reset} {expected}"
                )
            # A healthy lease: nothing to do. A reset hint here invites an operator to reset a
            # live run; a lease that lapses is recovered by the sensor on its own.
            return (
                f"nothing: run {facts.run_id!r} is working on it (a lease that lapses is "
                "recovered automatically)"
            )
        if EDITED_OUTSIDE in decision.reason:
            # A hand edit is often meant: keeping it costs nothing, a force redoes the work.
            return f"keep the edit: storyboard accept {where}; or discard it: {force}"
        return force

    @property
    def running_healthy(self) -> bool:
        """Another run holds a live lease: not a fault (its own run shows the check running)."""
        running = self.facts.status == StepStatus.RUNNING
        return self.decision.code == CODE_ALREADY_RUNNING and running

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view (for ``--json`` output and logs)."""
        decision = self.decision
        return {
            "partition": self.partition_key,
            "step": self.step_id,
            "action": decision.action.value,
            "verdict": self.verdict.value,
            "launch": self.launch,
            "detail": self.detail,
            "reason": decision.reason,
            "origin": decision.origin.value if decision.origin else None,
            "code": decision.code,
            "waits_on": list(self.waits_on),
            "after": list(self.after),
            "deferred_until": decision.deferred_until,
            "expected_started_at": decision.expected_started_at,
            "expected_run_id": decision.expected_run_id,
            "run_key": self.run_key,
            "what_to_do": self.what_to_do,
        }
