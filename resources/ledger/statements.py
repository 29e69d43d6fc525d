"""Every SQL statement the ledger runs is named in a statement module (docs/DESIGN.md#ledger-sql);
this one holds a step row's: the row by its key, the owner's status writes and their row
locks, and the reads of rows (one, the running ones, in bulk, the newest change).

The store's parts (claims, status writes, publishing, pointers, audit and cost, reads,
settings) decide *when* a statement runs, in which transaction and how a retry after a
dropped connection recognises its own earlier success; *what* runs is named once, here or
in a statement module of its concern, and nowhere else in the ledger
(``tests/ledger/test_ledger_sql.py`` keeps it so): :mod:`~resources.ledger.claim_statements`
(claims, settled rows, journal lineages), :mod:`~resources.ledger.pointer_statements`
(commit pointers, seals, what gc keeps), :mod:`~resources.ledger.history_statements`
(history lines), :mod:`~resources.ledger.cost_statements` (provider calls and episode
counts), :mod:`~resources.ledger.settings_statements`,
:mod:`~resources.ledger.run_lease_statements`. The same statements run on PostgreSQL and
SQLite; the few that differ take ``on_sqlite`` (:func:`upsert`).

Two kinds of name:

- **prebuilt shapes** (``functools.cache``): the per-step statements (the claim, the
  owner's transition, its row lock, the history line) run for every step of every run.
  Each shape is built once with bind parameters named here (``k_*`` the row's key,
  ``c_*`` a claim's values, ``v_*`` a transition's, ``a_*`` a history line's): building
  and cache-keying a Core statement per call cost ~0.65 ms of client CPU per claim +
  transition, more than the round trips. SQLAlchemy still compiles each shape once per
  dialect and reuses it.
- **statement builders**: the rest, built from their values on each (rarer) call.

Nothing in a statement module executes; every function returns a statement.
"""

import functools
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from resources.ledger.tables import step_run, step_transition
from resources.ledger.transitions import status_guard

B = sa.bindparam


# The three columns that name a step's row (and its unique index).
KEY_COLUMNS = [step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id]
RUNNING = StepStatus.RUNNING.value


def upsert(on_sqlite: bool) -> Any:
    """The dialect's INSERT that knows ``ON CONFLICT`` (the same SQL on both)."""
    return sqlite.insert if on_sqlite else postgresql.insert


def key_params(key: StepKey) -> dict[str, str]:
    """The bind parameters of a prebuilt statement's key (``k_project``, ...)."""
    return {"k_project": key.project_id, "k_episode": key.episode_id, "k_step": key.step_id}


_KEY_WHERE = sa.and_(
    step_run.c.project_id == B("k_project"),
    step_run.c.episode_id == B("k_episode"),
    step_run.c.step_id == B("k_step"),
)


_OWNED_WHERE = sa.and_(_KEY_WHERE, step_run.c.run_id == B("k_mine"))


def row_of(key: StepKey) -> sa.ColumnElement[bool]:
    """The condition naming ``key``'s ``step_run`` row, with its values."""
    return sa.and_(
        step_run.c.project_id == key.project_id,
        step_run.c.episode_id == key.episode_id,
        step_run.c.step_id == key.step_id,
    )


def owned_row(key: StepKey, run_id: str) -> sa.ColumnElement[bool]:
    """``key``'s row while it still names ``run_id`` (docs/DESIGN.md#owner-aware)."""
    return sa.and_(row_of(key), step_run.c.run_id == run_id)


def row_columns(key: StepKey, names: Iterable[str]) -> sa.Select[Any]:
    """Some columns of ``key``'s row (a retry asking whether its own write landed)."""
    return sa.select(*(step_run.c[name] for name in names)).where(row_of(key))


@functools.cache
def transition(columns: tuple[str, ...], owned: bool) -> Any:
    """UPDATE of ``columns`` (bound as ``v_<column>``) on the key's row (owner-aware:
    while it names ``k_mine``)."""
    return (
        sa.update(step_run)
        .where(_OWNED_WHERE if owned else _KEY_WHERE)
        .values({column: B(f"v_{column}") for column in columns})
    )


@functools.cache
def lock_row(owned: bool) -> Any:
    """Lock the key's row (owner-aware: while it names ``k_mine``); its id, or nothing."""
    return sa.select(step_run.c.id).where(_OWNED_WHERE if owned else _KEY_WHERE).with_for_update()


def lock_claim(key: StepKey, run_id: str) -> sa.Select[Any]:
    """Lock ``key``'s row while it is running under the claim ``run_id`` (a claim's fencing
    token): its id, or nothing once the claim was taken over or settled."""
    return (
        sa.select(step_run.c.id)
        .where(owned_row(key, run_id), step_run.c.status == RUNNING)
        .with_for_update()
    )


def lock_status(key: StepKey, *columns: str) -> sa.Select[Any]:
    """Lock ``key``'s row and read ``status`` (and ``columns``) under the lock."""
    wanted = [step_run.c.status, *(step_run.c[name] for name in columns)]
    return sa.select(*wanted).where(row_of(key)).with_for_update()


def set_owned(key: StepKey, run_id: str, **values: Any) -> sa.Update:
    """Fixed ``values`` on the row while it names ``run_id`` (lease, recovery bookkeeping)."""
    return sa.update(step_run).where(owned_row(key, run_id)).values(**values)


def invalidate(key: StepKey, *, reason: str, ts: str) -> sa.Update:
    """Stale the row (an explicit force); a running row is its owner's."""
    return (
        sa.update(step_run)
        .where(row_of(key), status_guard("invalidate"))
        .values(
            status=StepStatus.STALE.value,
            updated_at=ts,
            result_summary=reason,
            checkpoint_seal=None,
        )
    )


def reset_running(key: StepKey, *, expected_started_at: str | None, reason: str, ts: str) -> Any:
    """The operator's reset of a stuck running row to failed, while it is still the
    claim the operator saw (its ``started_at``)."""
    started = (
        step_run.c.started_at.is_(None)
        if expected_started_at is None
        else step_run.c.started_at == expected_started_at
    )
    return (
        sa.update(step_run)
        .where(row_of(key), status_guard("reset_running"), started)
        .values(
            status=StepStatus.FAILED.value,
            error_message=reason,
            updated_at=ts,
            completed_at=ts,
            checkpoint_seal=None,
        )
    )


def set_seal(key: StepKey, seal: str | None) -> sa.Update:
    """The row's checkpoint seal, as is (a mutator's edit under the row lock)."""
    return sa.update(step_run).where(row_of(key)).values(checkpoint_seal=seal)


def of_episodes(table: sa.Table, episodes: Sequence[tuple[str, str]]) -> sa.ColumnElement[bool]:
    """Rows of ``table`` that belong to one of ``episodes`` ((project, episode) pairs)."""
    return sa.tuple_(table.c.project_id, table.c.episode_id).in_(list(episodes))


def step_row(key: StepKey) -> sa.Select[Any]:
    return sa.select(step_run).where(row_of(key))


def running_rows() -> sa.Select[Any]:
    return sa.select(step_run).where(step_run.c.status == RUNNING)


def newest_update() -> sa.Select[Any]:
    return sa.select(sa.func.max(step_run.c.updated_at))


def step_rows(
    *,
    columns: Sequence[str] | None,
    step_ids: Iterable[str] | None,
    episodes: Sequence[tuple[str, str]],
    changed_since: tuple[int, str] | None,
    by: Literal["pairs", "projects", "all"],
) -> sa.Select[Any]:
    """``step_run`` rows in one query (``columns`` and the key, or whole rows).

    ``changed_since=(seq, text)``: every row of the partitions touched since (a row with
    ``updated_at >=`` the text, or a history line after the seq) plus every row of
    ``episodes``; text comparison only, never a cast. Otherwise ``by`` filters to the
    ``episodes`` (project, episode) pairs, to their projects (too many pairs to list) or
    not at all.
    """
    if columns is None:
        query = sa.select(step_run)
    else:
        names = dict.fromkeys(("project_id", "episode_id", "step_id", *columns))
        query = sa.select(*(step_run.c[name] for name in names))
    if step_ids is not None:
        query = query.where(step_run.c.step_id.in_(list(step_ids)))
    pair = sa.tuple_(step_run.c.project_id, step_run.c.episode_id)
    listed = list(episodes)
    if changed_since is not None:
        seq, since = changed_since
        touched = sa.union(
            sa.select(step_run.c.project_id, step_run.c.episode_id).where(
                step_run.c.updated_at >= since
            ),
            sa.select(step_transition.c.project_id, step_transition.c.episode_id).where(
                step_transition.c.transition_seq > seq
            ),
        ).subquery()
        clause = pair.in_(sa.select(touched.c.project_id, touched.c.episode_id))
        return query.where(sa.or_(clause, pair.in_(listed)) if listed else clause)
    if by == "pairs":
        return query.where(pair.in_(listed))
    if by == "projects":
        return query.where(step_run.c.project_id.in_(sorted({p for p, _ in listed})))
    return query
