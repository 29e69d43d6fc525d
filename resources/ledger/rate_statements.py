"""The statements of the shared rate limit (docs/DESIGN.md#rate-limit): an endpoint and
model's ``rate_limit`` row seeded, locked, read and written, the ledger's clock read, and
the ``rate_wait`` rows of steps waiting for it.

Run by :mod:`resources.ledger.rate_limits` (the rules of every statement module are
:mod:`resources.ledger.statements`'). Nothing here executes; every function returns a
statement.
"""

from typing import Any

import sqlalchemy as sa

from pipeline_defs.resume.partition import StepKey
from resources.ledger.gcra import RateState
from resources.ledger.statements import upsert
from resources.ledger.tables import rate_limit, rate_wait

# PostgreSQL's clock, in seconds: one clock for every process that shares the row, whatever
# their hosts' clocks say. (SQLite is one host: its callers read their own clock.)
PG_NOW = sa.select(sa.extract("epoch", sa.func.clock_timestamp()))


def _endpoint(endpoint: str, model: str) -> tuple[sa.ColumnElement[bool], ...]:
    return (rate_limit.c.endpoint == endpoint, rate_limit.c.model == model)


def seed_rate(on_sqlite: bool, endpoint: str, model: str, now: str) -> Any:
    """The endpoint and model's row, if it has none: free now."""
    return (
        upsert(on_sqlite)(rate_limit)
        .values(
            endpoint=endpoint,
            model=model,
            request_at=0.0,
            token_at=0.0,
            paused_until=0.0,
            updated_at=now,
        )
        .on_conflict_do_nothing()
    )


def lock_rate(on_sqlite: bool, endpoint: str, model: str) -> sa.Select[Any]:
    """The row's state, locked for the transaction (SQLite's write lock is the database's)."""
    query = sa.select(
        rate_limit.c.request_at, rate_limit.c.token_at, rate_limit.c.paused_until
    ).where(*_endpoint(endpoint, model))
    return query if on_sqlite else query.with_for_update()


def write_rate(endpoint: str, model: str, state: RateState, now: str) -> Any:
    return (
        sa.update(rate_limit)
        .where(*_endpoint(endpoint, model))
        .values(
            request_at=state.request_at,
            token_at=state.token_at,
            paused_until=state.paused_until,
            updated_at=now,
        )
    )


def paused_until(endpoint: str, model: str) -> sa.Select[Any]:
    return sa.select(rate_limit.c.paused_until).where(*_endpoint(endpoint, model))


def note_wait(
    on_sqlite: bool, key: StepKey, run_id: str | None, endpoint: str, model: str, until: str
) -> Any:
    """The step waits for the rate limit until about ``until`` (replacing an earlier note)."""
    values = {"run_id": run_id, "endpoint": endpoint, "model": model, "until": until}
    return (
        upsert(on_sqlite)(rate_wait)
        .values(project_id=key.project_id, episode_id=key.episode_id, step_id=key.step_id, **values)
        .on_conflict_do_update(
            index_elements=[rate_wait.c.project_id, rate_wait.c.episode_id, rate_wait.c.step_id],
            set_=values,
        )
    )


def clear_wait(key: StepKey, run_id: str | None) -> Any:
    """The step's note, if this run wrote it."""
    return sa.delete(rate_wait).where(
        rate_wait.c.project_id == key.project_id,
        rate_wait.c.episode_id == key.episode_id,
        rate_wait.c.step_id == key.step_id,
        rate_wait.c.run_id.is_(None) if run_id is None else rate_wait.c.run_id == run_id,
    )


def waits() -> sa.Select[Any]:
    return sa.select(rate_wait)
