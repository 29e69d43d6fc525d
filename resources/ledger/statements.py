"""Every SQL statement the ledger runs, by name (docs/DESIGN.md#ledger-sql).

The store's parts (claims, status writes, publishing, pointers, audit and cost, reads,
settings) decide *when* a statement runs, in which transaction and how a retry after a
dropped connection recognises its own earlier success; *what* runs is named here, once,
and nowhere else in the ledger (``tests/ledger/test_ledger_sql.py`` keeps it so). The
same statements run on PostgreSQL and SQLite; the few that differ take ``on_sqlite``.

Two kinds of name:

- **prebuilt shapes** (``functools.cache``): the per-step statements (the claim, the
  owner's transition, its row lock, the history line) run for every step of every run.
  Each shape is built once with bind parameters named here (``k_*`` the row's key,
  ``c_*`` a claim's values, ``v_*`` a transition's, ``a_*`` a history line's): building
  and cache-keying a Core statement per call cost ~0.65 ms of client CPU per claim +
  transition, more than the round trips. SQLAlchemy still compiles each shape once per
  dialect and reuses it.
- **statement builders**: the rest, built from their values on each (rarer) call.

Nothing here executes; every function returns a statement.
"""

import functools
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from pipeline_defs.resume.errors import ErrorCode
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from resources.ledger.tables import (
    checkpoint_archive,
    episode_calls,
    provider_call,
    run_lease,
    setting_change,
    settings,
    step_run,
    step_transition,
)
from resources.ledger.transitions import status_guard

B = sa.bindparam

# The three columns that name a step's row (and its unique index).
_KEY_COLUMNS = [step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id]
_RUNNING = StepStatus.RUNNING.value


def _upsert(on_sqlite: bool) -> Any:
    """The dialect's INSERT that knows ``ON CONFLICT`` (the same SQL on both)."""
    return sqlite.insert if on_sqlite else postgresql.insert


# ---------------------------------------------------------------------- a row, by its key
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


# ---------------------------------------------------------------------- claims
# The statuses after which a claim starts new work: what was paid for is published (or
# nothing applied, or the inputs changed), so no reply of the earlier work is taken back.
_NEW_WORK_AFTER = tuple(
    s.value
    for s in (StepStatus.COMPLETED, StepStatus.PARTIAL, StepStatus.NOT_APPLICABLE, StepStatus.STALE)
)
# A failure that blames a reply: taking it back would fail the step the same way again.
REFUSED_REPLY = f"[{ErrorCode.PROVIDER_BAD_RESPONSE}]%"


def _new_work() -> sa.ColumnElement[bool]:
    """Whether a claim starts new work, so takes a new journal lineage
    (docs/DESIGN.md#reply-journal): asked to (``c_fresh``: a force, a redraw), or the row's
    work ended (published, not applicable, stale), or its last run refused a reply, or the
    row has none yet. A dead owner's recovery and a retry after any other failure go on with
    the same work and take back the replies it paid for."""
    return sa.or_(
        B("c_fresh", type_=sa.Boolean),
        step_run.c.journal_lineage.is_(None),
        step_run.c.status.in_(_NEW_WORK_AFTER),
        sa.and_(
            step_run.c.status == StepStatus.FAILED.value,
            step_run.c.error_message.like(REFUSED_REPLY),
        ),
    )


@functools.cache
def claim(on_sqlite: bool, seen: str, steal: bool, auto: bool, beat: bool) -> Any:
    """The claim upsert of docs/DESIGN.md#claims for one shape.

    ``seen``: "any" (no compare-and-set), "none" (the judge saw no row: only the insert may
    win) or "row" (the row must still have the run_id / updated_at the judge read);
    ``steal``: a stale running row may be taken over if started_at and run_id are still the
    texts the judge read; ``auto``: an automatic recovery (counted, reason recorded);
    ``beat``: the steal also needs heartbeat_at to be the text the judge read (an owner
    that renewed its lease since is alive). Returns the row's ``run_id`` when it won.
    """
    insert = _upsert(on_sqlite)(step_run).values(
        id=B("c_id"),
        project_id=B("k_project"),
        episode_id=B("k_episode"),
        step_id=B("k_step"),
        status=_RUNNING,
        run_id=B("c_run_id"),
        started_at=B("c_ts"),
        created_at=B("c_ts"),
        updated_at=B("c_ts"),
        heartbeat_at=B("c_ts"),
        lock_owner=B("c_owner"),
        recovery_count=1 if auto else 0,
        last_recovery_reason=B("c_reason") if auto else None,
        journal_lineage=B("c_id"),
    )
    may_take: sa.ColumnElement[bool] = status_guard("claim")  # docs/DESIGN.md#status-transitions
    if seen == "none":
        may_take = sa.false()
    elif seen == "row":
        may_take = sa.and_(
            may_take,
            step_run.c.run_id.is_not_distinct_from(B("c_seen_run_id", type_=sa.String)),
            step_run.c.updated_at == B("c_seen_updated_at", type_=sa.Text),
        )
    if steal:  # a NULL started_at is never stealable: the caller only asks with both texts
        may_take = sa.or_(
            may_take,
            sa.and_(
                status_guard("steal"),
                step_run.c.started_at == B("c_expected_started_at", type_=sa.Text),
                step_run.c.run_id == B("c_expected_run_id", type_=sa.String),
                step_run.c.heartbeat_at == B("c_expected_heartbeat_at", type_=sa.Text)
                if beat
                else sa.true(),
            ),
        )
    update: dict[str, Any] = {
        "run_id": B("c_run_id"),
        "status": _RUNNING,
        "started_at": B("c_ts"),
        "updated_at": B("c_ts"),
        "heartbeat_at": B("c_ts"),
        "lock_owner": B("c_owner"),
        "completed_at": None,
        "error_message": None,
        "checkpoint_seal": None,
        "recovery_count": step_run.c.recovery_count + (1 if auto else 0),
        "journal_lineage": sa.case((_new_work(), B("c_id")), else_=step_run.c.journal_lineage),
    }
    if auto:
        update["last_recovery_reason"] = B("c_reason")
    return insert.on_conflict_do_update(
        index_elements=_KEY_COLUMNS, set_=update, where=may_take
    ).returning(step_run.c.run_id)


def _settled_row(
    on_sqlite: bool, key: StepKey, run_id: str, status: StepStatus, summary: str, ts: str
) -> Any:
    """INSERT of a finished row (adoption, not-applicable) with every NOT NULL column."""
    return _upsert(on_sqlite)(step_run).values(
        id=str(uuid.uuid4()),
        project_id=key.project_id,
        episode_id=key.episode_id,
        step_id=key.step_id,
        status=status.value,
        run_id=run_id,
        result_summary=summary,
        completed_at=ts,
        created_at=ts,
        updated_at=ts,
        recovery_count=0,
    )


def adopt(
    on_sqlite: bool,
    key: StepKey,
    run_id: str,
    *,
    summary: str,
    seal: str | None,
    pointer: str | None,
    ts: str,
) -> Any:
    """Insert a completed row for a verified orphan checkpoint; never over an existing
    row (returns its id when inserted)."""
    return (
        _settled_row(on_sqlite, key, run_id, StepStatus.COMPLETED, summary, ts)
        .values(checkpoint_seal=seal, checkpoint_pointer=pointer)
        .on_conflict_do_nothing(index_elements=_KEY_COLUMNS)
        .returning(step_run.c.id)
    )


def mark_not_applicable(on_sqlite: bool, key: StepKey, run_id: str, reason: str, ts: str) -> Any:
    """Upsert a not-applicable row; never over a running one (returns its id when written)."""
    return (
        _settled_row(on_sqlite, key, run_id, StepStatus.NOT_APPLICABLE, reason, ts)
        .on_conflict_do_update(
            index_elements=_KEY_COLUMNS,
            set_={
                "status": StepStatus.NOT_APPLICABLE.value,
                "run_id": run_id,
                "result_summary": reason,
                "completed_at": ts,
                "updated_at": ts,
                "error_message": None,
            },
            where=status_guard("mark_not_applicable"),
        )
        .returning(step_run.c.id)
    )


# ---------------------------------------------------------------------- status writes
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
        .where(owned_row(key, run_id), step_run.c.status == _RUNNING)
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


# ---------------------------------------------------------------------- commit pointers
def _archive_of(key: StepKey) -> sa.ColumnElement[bool]:
    return sa.and_(
        checkpoint_archive.c.project_id == key.project_id,
        checkpoint_archive.c.episode_id == key.episode_id,
        checkpoint_archive.c.step_id == key.step_id,
    )


def pointer_of(key: StepKey) -> sa.Select[Any]:
    """The row's commit pointer."""
    return sa.select(step_run.c.checkpoint_pointer).where(row_of(key))


def lock_settled_pointer(key: StepKey) -> sa.Select[Any]:
    """Lock the row, unless it is running, and read its commit pointer."""
    return (
        sa.select(step_run.c.checkpoint_pointer)
        .where(sa.and_(row_of(key), step_run.c.status != _RUNNING))
        .with_for_update()
    )


def set_pointer(key: StepKey, pointer: str | None) -> sa.Update:
    return sa.update(step_run).where(row_of(key)).values(checkpoint_pointer=pointer)


def archive_pointer(
    key: StepKey, pointer: str, *, reason: str, run_id: str | None, now: str
) -> sa.Insert:
    """Keep a replaced pointer in ``checkpoint_archive``."""
    return sa.insert(checkpoint_archive).values(
        project_id=key.project_id,
        episode_id=key.episode_id,
        step_id=key.step_id,
        pointer=pointer,
        reason=reason,
        run_id=run_id,
        archived_at=now,
    )


def archives_beyond(key: StepKey, keep: int) -> sa.Select[Any]:
    """The ids of the step's archived pointers older than its newest ``keep``."""
    return (
        sa.select(checkpoint_archive.c.id)
        .where(_archive_of(key))
        .order_by(checkpoint_archive.c.id.desc())
        .offset(max(keep, 0))
    )


def drop_archives(ids: Sequence[int]) -> sa.Delete:
    return sa.delete(checkpoint_archive).where(checkpoint_archive.c.id.in_(ids))


def archived_pointers(key: StepKey) -> sa.Select[Any]:
    """The step's archived pointers, newest first."""
    return (
        sa.select(checkpoint_archive.c.pointer)
        .where(_archive_of(key))
        .order_by(checkpoint_archive.c.id.desc())
    )


def adopt_pointer(key: StepKey, pointer: str, *, now: str) -> sa.Update:
    """A settled row's first pointer; its seal (of the old home's files) cleared."""
    return (
        sa.update(step_run)
        .where(row_of(key))
        .values(checkpoint_pointer=pointer, checkpoint_seal=None, updated_at=now)
    )


# ---------------------------------------------------------------------- checkpoint seals
def clear_seal(key: StepKey, seal: str, *, now: str) -> sa.Update:
    """Drop ``seal`` from the row while it still carries exactly it."""
    return (
        sa.update(step_run)
        .where(sa.and_(row_of(key), step_run.c.checkpoint_seal == seal))
        .values(checkpoint_seal=None, updated_at=now)
    )


def seal_unchanged(
    key: StepKey,
    seal: str,
    *,
    run_id: str | None,
    updated_at: str | None,
    pointer: str | None,
) -> sa.Update:
    """Seal a completed, unsealed row while it is exactly as it was read (its ``run_id``,
    ``updated_at`` and pointer); ``updated_at`` does not move."""
    return (
        sa.update(step_run)
        .where(
            sa.and_(
                row_of(key),
                step_run.c.status == StepStatus.COMPLETED.value,
                step_run.c.checkpoint_seal.is_(None),
                step_run.c.run_id.is_not_distinct_from(sa.literal(run_id, sa.String)),
                step_run.c.updated_at.is_not_distinct_from(sa.literal(updated_at, sa.Text)),
                step_run.c.checkpoint_pointer.is_not_distinct_from(sa.literal(pointer, sa.Text)),
            )
        )
        .values(checkpoint_seal=seal)
    )


def clear_episode_seals(project_id: str, episode_id: str, *, now: str) -> sa.Update:
    """Drop every seal of one episode's rows."""
    return (
        sa.update(step_run)
        .where(
            sa.and_(
                step_run.c.project_id == project_id,
                step_run.c.episode_id == episode_id,
                step_run.c.checkpoint_seal.is_not(None),
            )
        )
        .values(checkpoint_seal=None, updated_at=now)
    )


# ---------------------------------------------------------------------- what GC must keep
def current_pointers() -> sa.Select[Any]:
    return sa.select(step_run.c.checkpoint_pointer).where(
        step_run.c.checkpoint_pointer.is_not(None)
    )


def every_archived_pointer() -> sa.Select[Any]:
    return sa.select(checkpoint_archive.c.pointer)


def journal_lineage(key: StepKey, run_id: str) -> sa.Select[Any]:
    """The journal lineage of the row while ``run_id`` holds it."""
    return sa.select(step_run.c.journal_lineage).where(
        sa.and_(row_of(key), step_run.c.run_id == run_id)
    )


def journal_lineages() -> sa.Select[Any]:
    """Every row's key, status and journal lineage (what the journal's collection keeps)."""
    return sa.select(
        step_run.c.project_id,
        step_run.c.episode_id,
        step_run.c.step_id,
        step_run.c.status,
        step_run.c.journal_lineage,
    )


def claims_held() -> sa.Select[Any]:
    """Every claim (``run_id``, ``started_at``) whose attempt may be writing."""
    return sa.select(step_run.c.run_id, step_run.c.started_at).where(
        sa.and_(step_run.c.run_id.is_not(None), step_run.c.started_at.is_not(None))
    )


def running_keys() -> sa.Select[Any]:
    return sa.select(step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id).where(
        step_run.c.status == _RUNNING
    )


# ---------------------------------------------------------------------- history lines
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


def _of_episodes(table: sa.Table, episodes: Sequence[tuple[str, str]]) -> sa.ColumnElement[bool]:
    """Rows of ``table`` that belong to one of ``episodes`` ((project, episode) pairs)."""
    return sa.tuple_(table.c.project_id, table.c.episode_id).in_(list(episodes))


def history(
    key: StepKey | None, *, since_seq: int, episodes: Sequence[tuple[str, str]] | None = None
) -> sa.Select[Any]:
    """History lines after ``since_seq`` (of one step, some episodes, or all), in commit
    order."""
    query = sa.select(step_transition).where(step_transition.c.transition_seq > since_seq)
    if episodes is not None:
        query = query.where(_of_episodes(step_transition, episodes))
    if key is not None:
        query = query.where(
            step_transition.c.project_id == key.project_id,
            step_transition.c.episode_id == key.episode_id,
            step_transition.c.step_id == key.step_id,
        )
    return query.order_by(step_transition.c.transition_seq)


# ---------------------------------------------------------------------- provider calls (cost)
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
        _upsert(on_sqlite)(episode_calls)
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
        _upsert(on_sqlite)(episode_calls)
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


def finish_call(call_id: int, *, units: int, model: str | None, now: str) -> sa.Update:
    return (
        sa.update(provider_call)
        .where(provider_call.c.id == call_id)
        .values(units=units, model=model, finished_at=now)
    )


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
        query = query.where(_of_episodes(provider_call, episodes))
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


# ---------------------------------------------------------------------- step rows, read
def step_row(key: StepKey) -> sa.Select[Any]:
    return sa.select(step_run).where(row_of(key))


def running_rows() -> sa.Select[Any]:
    return sa.select(step_run).where(step_run.c.status == _RUNNING)


def newest_transition_seq() -> sa.Select[Any]:
    return sa.select(sa.func.max(step_transition.c.transition_seq))


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


# ---------------------------------------------------------------------- settings
# Serialize changes of the settings table on PostgreSQL (SQLite's BEGIN IMMEDIATE does).
LOCK_SETTINGS = "LOCK TABLE settings IN SHARE ROW EXCLUSIVE MODE"


def every_setting() -> sa.Select[Any]:
    return sa.select(settings.c.key, settings.c.value)


def insert_setting(key: str, **row: str) -> sa.Insert:
    return sa.insert(settings).values(key=key, **row)


def update_setting(key: str, **row: str) -> sa.Update:
    return sa.update(settings).where(settings.c.key == key).values(**row)


def record_setting_change(
    key: str, *, old: str | None, new: str, at: str, changed_by: str
) -> sa.Insert:
    return sa.insert(setting_change).values(
        key=key, old_value=old, new_value=new, changed_at=at, changed_by=changed_by
    )


def setting_changes() -> sa.Select[Any]:
    return sa.select(setting_change).order_by(setting_change.c.id)


# ---------------------------------------------------------------------- run leases
def begin_run_lease(on_sqlite: bool, run_id: str, *, now: str, worker: str) -> Any:
    """A run's lease, taken (or taken again: a resumed run's new coordinator) at ``now``."""
    values = {"run_id": run_id, "started_at": now, "heartbeat_at": now, "worker": worker}
    insert = _upsert(on_sqlite)(run_lease).values(values)
    return insert.on_conflict_do_update(
        index_elements=[run_lease.c.run_id],
        set_={"heartbeat_at": now, "ended_at": None, "worker": worker},
    )


def renew_run_lease(run_id: str, *, now: str) -> sa.Update:
    """Renew a run's lease while it is not ended (the coordinator's heartbeat)."""
    return (
        sa.update(run_lease)
        .where(run_lease.c.run_id == run_id, run_lease.c.ended_at.is_(None))
        .values(heartbeat_at=now)
    )


def end_run_lease(run_id: str, *, now: str) -> sa.Update:
    """The coordinator finished (or the run was ended): its lease proves nothing more."""
    return (
        sa.update(run_lease)
        .where(run_lease.c.run_id == run_id, run_lease.c.ended_at.is_(None))
        .values(ended_at=now)
    )


def run_leases(run_ids: Sequence[str] | None, *, open_only: bool) -> sa.Select[Any]:
    """Run leases (of some runs, or all; only those not ended with ``open_only``)."""
    query = sa.select(run_lease)
    if run_ids is not None:
        query = query.where(run_lease.c.run_id.in_(list(run_ids)))
    if open_only:
        query = query.where(run_lease.c.ended_at.is_(None))
    return query.order_by(run_lease.c.run_id)
