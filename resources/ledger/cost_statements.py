"""The statements of provider calls and their episode's count (docs/DESIGN.md#spend-cap):
a call's row drawn, recorded and finished, the episode's ``episode_calls`` row seeded,
counted against its cap and estimated, and the cost rows read back.

Run by :mod:`resources.ledger.audit_and_cost` and :mod:`resources.ledger.reads` (the rules
of every statement module are :mod:`resources.ledger.statements`'). Nothing here executes;
every function returns a statement.
"""

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from pipeline_defs.resume.money import Usage
from pipeline_defs.resume.partition import StepKey
from resources.ledger.statements import of_episodes, upsert
from resources.ledger.tables import episode_calls, provider_call

# The next provider_call id on PostgreSQL (drawn before the insert: a retried insert names
# the same row).
NEXT_CALL_ID = sa.select(
    sa.func.nextval(sa.func.pg_get_serial_sequence(provider_call.name, provider_call.c.id.name))
)


def _episode_of(key: StepKey) -> tuple[sa.ColumnElement[bool], ...]:
    return (
        episode_calls.c.project_id == key.project_id,
        episode_calls.c.episode_id == key.episode_id,
    )


def seed_episode_calls(on_sqlite: bool, key: StepKey) -> Any:
    """The episode's ``episode_calls`` row, if it has none, at the calls it has recorded."""
    recorded = (
        sa.select(sa.literal(key.project_id), sa.literal(key.episode_id), sa.func.count())
        .select_from(provider_call)
        .where(
            provider_call.c.project_id == key.project_id,
            provider_call.c.episode_id == key.episode_id,
        )
    )
    return (
        upsert(on_sqlite)(episode_calls)
        .from_select(["project_id", "episode_id", "calls"], recorded)
        .on_conflict_do_nothing()
    )


def note_estimate(on_sqlite: bool, project_id: str, episode_id: str, estimated: int) -> Any:
    """The episode's estimate in its ``episode_calls`` row (seeded at the calls it has
    recorded if it has none): an estimate noted again replaces the earlier one."""
    recorded = (
        sa.select(
            sa.literal(project_id),
            sa.literal(episode_id),
            sa.func.count(),
            sa.literal(estimated),
        )
        .select_from(provider_call)
        .where(
            provider_call.c.project_id == project_id,
            provider_call.c.episode_id == episode_id,
        )
    )
    return (
        upsert(on_sqlite)(episode_calls)
        .from_select(["project_id", "episode_id", "calls", "estimated"], recorded)
        .on_conflict_do_update(
            index_elements=[episode_calls.c.project_id, episode_calls.c.episode_id],
            set_={"estimated": estimated},
        )
    )


def episode_estimate(project_id: str, episode_id: str) -> sa.Select[Any]:
    return sa.select(episode_calls.c.estimated).where(
        episode_calls.c.project_id == project_id,
        episode_calls.c.episode_id == episode_id,
    )


def count_call(key: StepKey, cap: int | None) -> sa.Update:
    """One more call in the episode's count, only while it is below ``cap`` (takes the
    row's lock: of two racing for the last call, the second finds the cap)."""
    within = (episode_calls.c.calls < cap,) if cap is not None else ()
    return (
        sa.update(episode_calls)
        .where(*_episode_of(key), *within)
        .values(calls=episode_calls.c.calls + 1)
    )


def episode_call_count(project_id: str, episode_id: str) -> sa.Select[Any]:
    return sa.select(episode_calls.c.calls).where(
        episode_calls.c.project_id == project_id,
        episode_calls.c.episode_id == episode_id,
    )


def record_call(values: Mapping[str, Any]) -> sa.Insert:
    """A provider call's row (with ``id`` when drawn first); returns its id."""
    return sa.insert(provider_call).values(dict(values)).returning(provider_call.c.id)


def call_by_id(call_id: int) -> sa.Select[Any]:
    return sa.select(provider_call.c.id).where(provider_call.c.id == call_id)


def finish_call(
    call_id: int,
    *,
    units: int,
    model: str | None,
    now: str,
    usage: Usage | None = None,
    cost: int | None = None,
) -> sa.Update:
    """A call's reply (or failure): what it used as its endpoint reported it, and its cost
    when that is its reservation exactly (else ``resources.ledger.spend`` settles it)."""
    values: dict[str, Any] = {"units": units, "model": model, "finished_at": now}
    if usage is not None:
        values.update(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_input_tokens=usage.cached_input_tokens,
        )
    if cost is not None:
        values["cost_micros"] = cost
    return sa.update(provider_call).where(provider_call.c.id == call_id).values(values)


def provider_calls(
    step_id: str | None,
    *,
    project_id: str | None,
    episode_id: str | None,
    run_id: str | None,
    episodes: Sequence[tuple[str, str]] | None = None,
) -> sa.Select[Any]:
    """Provider-call rows (of one step, one or some episodes, one run, or all), by id."""
    query = sa.select(provider_call)
    if episodes is not None:
        query = query.where(of_episodes(provider_call, episodes))
    if step_id is not None:
        query = query.where(provider_call.c.step_id == step_id)
    if project_id is not None and episode_id is not None:
        query = query.where(
            provider_call.c.project_id == project_id,
            provider_call.c.episode_id == episode_id,
        )
    if run_id is not None:
        query = query.where(provider_call.c.run_id == run_id)
    return query.order_by(provider_call.c.id)
