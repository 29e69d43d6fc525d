"""The statements of money (docs/DESIGN.md#money-budgets): a call's worst case reserved in
its episode's ``episode_calls.cost_micros`` and its project's ``project_day_spend`` row
under their budgets, its usage and cost settled, and the spend read back.

Run by :mod:`resources.ledger.spend` (the rules of every statement module are
:mod:`resources.ledger.statements`'). Nothing here executes; every function returns a
statement.
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from pipeline_defs.resume.partition import StepKey
from resources.ledger.statements import of_episodes, upsert
from resources.ledger.tables import episode_calls, project_day_spend, provider_call

# What a call spent: its settled cost, else (failed, outcome unknown, not settled yet) the
# worst case reserved for it.
SPENT = sa.func.coalesce(provider_call.c.cost_micros, provider_call.c.reserved_micros)


def _day_of(column: Any) -> Any:
    """The UTC day (``YYYY-MM-DD``) of an ISO timestamp column."""
    return sa.func.substr(column, 1, 10)


def reserve_episode(key: StepKey, micros: int, limit: int | None) -> sa.Update:
    """``micros`` more in the episode's spend, only while it stays within ``limit`` (takes
    the row's lock, as the call count does: of two racing for the last money, the second
    finds it spent)."""
    within = (episode_calls.c.cost_micros + micros <= limit,) if limit is not None else ()
    return (
        sa.update(episode_calls)
        .where(
            episode_calls.c.project_id == key.project_id,
            episode_calls.c.episode_id == key.episode_id,
            *within,
        )
        .values(cost_micros=episode_calls.c.cost_micros + micros)
    )


def episode_spend(project_id: str, episode_id: str) -> sa.Select[Any]:
    return sa.select(episode_calls.c.cost_micros).where(
        episode_calls.c.project_id == project_id,
        episode_calls.c.episode_id == episode_id,
    )


def seed_project_day(on_sqlite: bool, project_id: str, day: str) -> Any:
    """The project's row of ``day``, if it has none, at what its calls of the day spent (read
    once a day: the day's first call finds the row missing)."""
    spent = (
        sa.select(
            sa.literal(project_id),
            sa.literal(day),
            sa.func.coalesce(sa.func.sum(SPENT), 0),
            sa.func.count(),
            sa.func.count(provider_call.c.price),
        )
        .select_from(provider_call)
        .where(provider_call.c.project_id == project_id, _day_of(provider_call.c.at) == day)
    )
    return (
        upsert(on_sqlite)(project_day_spend)
        .from_select(["project_id", "day", "cost_micros", "calls", "priced"], spent)
        .on_conflict_do_nothing()
    )


def reserve_project_day(
    project_id: str, day: str, micros: int, limit: int | None, *, priced: bool
) -> sa.Update:
    """One call more in the project's row of ``day``, and ``micros`` more in its spend, only
    while within ``limit``."""
    within = (project_day_spend.c.cost_micros + micros <= limit,) if limit is not None else ()
    return (
        sa.update(project_day_spend)
        .where(
            project_day_spend.c.project_id == project_id, project_day_spend.c.day == day, *within
        )
        .values(
            cost_micros=project_day_spend.c.cost_micros + micros,
            calls=project_day_spend.c.calls + 1,
            priced=project_day_spend.c.priced + (1 if priced else 0),
        )
    )


def project_day_total(project_id: str, day: str) -> sa.Select[Any]:
    return sa.select(project_day_spend.c.cost_micros).where(
        project_day_spend.c.project_id == project_id, project_day_spend.c.day == day
    )


def call_to_settle(call_id: int) -> sa.Select[Any]:
    """A call's episode, day and reservation, if it is not finished yet."""
    return sa.select(
        provider_call.c.project_id,
        provider_call.c.episode_id,
        provider_call.c.at,
        provider_call.c.reserved_micros,
    ).where(provider_call.c.id == call_id, provider_call.c.finished_at.is_(None))


def shift_episode(project_id: str, episode_id: str, delta: int) -> sa.Update:
    """A settled call's cost in place of its reservation in the episode's spend."""
    return (
        sa.update(episode_calls)
        .where(episode_calls.c.project_id == project_id, episode_calls.c.episode_id == episode_id)
        .values(cost_micros=episode_calls.c.cost_micros + delta)
    )


def shift_project_day(project_id: str, day: str, delta: int) -> sa.Update:
    return (
        sa.update(project_day_spend)
        .where(project_day_spend.c.project_id == project_id, project_day_spend.c.day == day)
        .values(cost_micros=project_day_spend.c.cost_micros + delta)
    )


def spend_by_episode(
    project_id: str | None = None, episodes: Sequence[tuple[str, str]] | None = None
) -> sa.Select[Any]:
    """Per episode and UTC day: calls and money (spent or reserved), of one project, of
    ``episodes`` ((project, episode) pairs), or of all."""
    query = sa.select(
        provider_call.c.project_id,
        provider_call.c.episode_id,
        _day_of(provider_call.c.at).label("day"),
        sa.func.count().label("calls"),
        sa.func.coalesce(sa.func.sum(SPENT), 0).label("micros"),
        sa.func.count(provider_call.c.price).label("priced"),
    ).group_by(provider_call.c.project_id, provider_call.c.episode_id, _day_of(provider_call.c.at))
    if project_id is not None:
        query = query.where(provider_call.c.project_id == project_id)
    if episodes is not None:
        query = query.where(of_episodes(provider_call, episodes))
    return query


def _totals(today: str) -> list[Any]:
    """Calls and money in all and of ``today`` (UTC), and the calls that had a price."""
    of_today = _day_of(provider_call.c.at) == today
    return [
        sa.func.count().label("calls"),
        sa.func.coalesce(sa.func.sum(sa.case((of_today, 1), else_=0)), 0).label("calls_today"),
        sa.func.coalesce(sa.func.sum(SPENT), 0).label("micros"),
        sa.func.coalesce(sa.func.sum(sa.case((of_today, SPENT), else_=0)), 0).label("micros_today"),
        sa.func.count(provider_call.c.price).label("priced"),
    ]


def episode_totals(
    today: str,
    episodes: Sequence[tuple[str, str]] | None = None,
    project_ids: Sequence[str] | None = None,
) -> sa.Select[Any]:
    """Per episode of ``episodes`` ((project, episode) pairs), else of the projects
    ``project_ids``: its calls and money in all and of ``today``."""
    query = sa.select(
        provider_call.c.project_id, provider_call.c.episode_id, *_totals(today)
    ).group_by(provider_call.c.project_id, provider_call.c.episode_id)
    if episodes is not None:
        query = query.where(of_episodes(provider_call, episodes))
    if project_ids is not None:
        query = query.where(provider_call.c.project_id.in_(list(project_ids)))
    return query


def project_totals(today: str, project_ids: Sequence[str]) -> sa.Select[Any]:
    """Per project of ``project_ids``: its calls and money in all and of ``today``, every
    episode of it together, from its rows per day (a few per project, whatever its calls)."""
    day = project_day_spend.c
    of_today = day.day == today
    return (
        sa.select(
            day.project_id,
            sa.func.sum(day.calls),
            sa.func.coalesce(sa.func.sum(sa.case((of_today, day.calls), else_=0)), 0),
            sa.func.sum(day.cost_micros),
            sa.func.coalesce(sa.func.sum(sa.case((of_today, day.cost_micros), else_=0)), 0),
            sa.func.sum(day.priced),
        )
        .where(day.project_id.in_(list(project_ids)))
        .group_by(day.project_id)
    )
