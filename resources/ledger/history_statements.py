"""The statements of the history (docs/DESIGN.md#audit): one ``step_transition`` line
appended (a prebuilt shape), a retry's own line found again, the lines read back in commit
order, and the newest line's ``transition_seq`` (half of the ledger's cursor).

Run by :mod:`resources.ledger.audit` and :mod:`resources.ledger.reads` (the rules of every
statement module are :mod:`resources.ledger.statements`'). Nothing here executes; every
function returns a statement.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from pipeline_defs.resume.partition import StepKey
from resources.ledger.statements import B, of_episodes
from resources.ledger.tables import step_transition

HISTORY_COLUMNS = (
    "project_id",
    "episode_id",
    "step_id",
    "from_status",
    "to_status",
    "action",
    "origin",
    "reason",
    "run_id",
    "launch_path",
    "at",
    "worker",
)


# One history line, bound as ``a_<column>``; its ``transition_seq``.
APPEND_HISTORY = (
    sa.insert(step_transition)
    .values({column: B(f"a_{column}") for column in HISTORY_COLUMNS})
    .returning(step_transition.c.transition_seq)
)


def history_line(values: Mapping[str, str | None]) -> sa.Select[Any]:
    """The ``transition_seq`` of a line with exactly these values (a retry's own line)."""
    same = [
        step_transition.c[k].is_not_distinct_from(sa.literal(v, sa.Text)) for k, v in values.items()
    ]
    return sa.select(step_transition.c.transition_seq).where(*same)


def history(
    key: StepKey | None, *, since_seq: int, episodes: Sequence[tuple[str, str]] | None = None
) -> sa.Select[Any]:
    """History lines after ``since_seq`` (of one step, some episodes, or all), in commit
    order."""
    query = sa.select(step_transition).where(step_transition.c.transition_seq > since_seq)
    if episodes is not None:
        query = query.where(of_episodes(step_transition, episodes))
    if key is not None:
        query = query.where(
            step_transition.c.project_id == key.project_id,
            step_transition.c.episode_id == key.episode_id,
            step_transition.c.step_id == key.step_id,
        )
    return query.order_by(step_transition.c.transition_seq)


def newest_transition_seq() -> sa.Select[Any]:
    return sa.select(sa.func.max(step_transition.c.transition_seq))
