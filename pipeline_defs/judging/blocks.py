"""Which blocks a tick reports: a block per (step, partition) is reported when it changes.

The cursor keeps a short signature of every current block per (step, partition) slot; a
block whose signature is new is reported failed, and a slot that leaves the block state
is reported passed once. A step another run holds a live lease on (``running_healthy``)
is no block (docs/DESIGN.md#reports): never reported nor kept, so a clearance is only ever
published for a block that was.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pipeline_defs.judging.step_evaluation import StepEvaluation


@dataclass(frozen=True)
class CheckChange:
    """A block appeared or changed (``passed`` False) or went away (``passed`` True)."""

    evaluation: StepEvaluation
    passed: bool


def block_diff(
    evaluations: Iterable[StepEvaluation],
    blocked: Mapping[str, str],
    keys: Iterable[str],
    step_ids: Iterable[str],
) -> tuple[list[CheckChange], dict[str, str]]:
    """(block reports, the blocks after this tick): a report only when the block state
    of a (step, partition) changes; slots of partitions or steps gone are forgotten."""
    after = dict(blocked)
    checks: list[CheckChange] = []
    for ev in evaluations:
        slot = ev.slot
        signature = None if ev.running_healthy else ev.block_signature
        if signature is not None:
            if after.get(slot) != signature:
                checks.append(CheckChange(ev, passed=False))
            after[slot] = signature
        elif slot in after:
            checks.append(CheckChange(ev, passed=True))
            del after[slot]
    known, steps = set(keys), set(step_ids)
    for slot in [s for s in after if s.split("|", 1)[-1] not in known]:
        del after[slot]
    for slot in [s for s in after if s.split("|", 1)[0] not in steps]:
        del after[slot]
    return checks, after
