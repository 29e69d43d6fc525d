"""The step status transitions the ledger allows, as data (docs/DESIGN.md#status-transitions).

Each ledger operation that writes ``step_run.status`` takes a row in one of its ``sources``
(``None``: no row yet, the operation inserts it) to one of its ``targets``. The store builds
the status condition of those operations' ``WHERE`` from this table (:func:`status_guard`);
``tests/ledger/test_transition_diagram.py`` checks the diagram in docs/DESIGN.md against it
and the store's behaviour against both.

``transition`` is the one operation guarded by the owner, not by the status: it updates the
row while it still names the run (docs/DESIGN.md#owner-aware), which holds it ``running``
from its claim until this first transition. Its targets are what the run protocol records;
the store itself accepts any :class:`StepStatus` there (tests set rows up through it).
"""

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import sqlalchemy as sa

from pipeline_defs.resume.status import StepStatus
from resources.ledger.tables import step_run

# A source that is no row at all: the operation inserts one (mermaid's [*]).
NO_ROW = None
NOT_RUNNING = frozenset(StepStatus) - {StepStatus.RUNNING}


@dataclass(frozen=True)
class Move:
    """What one ledger operation may do to a row's status."""

    sources: frozenset[StepStatus | None]
    targets: frozenset[StepStatus]


def _move(sources: Iterable[StepStatus | None], *targets: StepStatus) -> Move:
    return Move(frozenset(sources), frozenset(targets))


# ledger operation (a LedgerStore method; "steal" is claim(allow_stale_steal=True)) -> Move
TRANSITIONS: Mapping[str, Move] = MappingProxyType(
    {
        # docs/DESIGN.md#claims: a row that is not running, or none ...
        "claim": _move({NO_ROW, *NOT_RUNNING}, StepStatus.RUNNING),
        # ... or, for a stale-lease recovery, a running row still as the judge read it
        "steal": _move({StepStatus.RUNNING}, StepStatus.RUNNING),
        # docs/DESIGN.md#owner-aware: the owner records how its run ended
        "transition": _move(
            {StepStatus.RUNNING}, StepStatus.COMPLETED, StepStatus.PARTIAL, StepStatus.FAILED
        ),
        # decision table row 4: an orphan checkpoint verified clean, insert-only
        "adopt": _move({NO_ROW}, StepStatus.COMPLETED),
        # decision table row 1: never over a running row
        "mark_not_applicable": _move({NO_ROW, *NOT_RUNNING}, StepStatus.NOT_APPLICABLE),
        # an explicit force upstream: running rows are left to their owner
        "invalidate": _move(NOT_RUNNING, StepStatus.STALE),
        # the operator's reset of a stuck row (docs/DESIGN.md#recovery)
        "reset_running": _move({StepStatus.RUNNING}, StepStatus.FAILED),
    }
)

# How the diagram names the absent row.
START = "[*]"


def edges(table: Mapping[str, Move] = TRANSITIONS) -> frozenset[tuple[str, str, str]]:
    """Every allowed move as (source, target, operation), the absent row as ``[*]``."""
    return frozenset(
        (START if source is None else source.value, target.value, operation)
        for operation, move in table.items()
        for source in move.sources
        for target in move.targets
    )


@functools.cache
def status_guard(operation: str) -> sa.ColumnElement[bool]:
    """The condition on an existing row's status under which ``operation`` may take it.

    Written the short way: ``status != 'running'`` for every status but one (so a text
    older than the CHECK constraint is no more refused than before), ``=`` for one.
    """
    sources = {s for s in TRANSITIONS[operation].sources if s is not None}
    others = sorted(s.value for s in set(StepStatus) - sources)
    if not sources:
        return sa.false()
    if not others:
        return sa.true()
    if len(others) == 1:
        return step_run.c.status != others[0]
    if len(sources) == 1:
        return step_run.c.status == next(iter(sources)).value
    return step_run.c.status.in_(sorted(s.value for s in sources))
