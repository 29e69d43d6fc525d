"""The statements of commit pointers and checkpoint seals: a row's pointer, its archive
(``checkpoint_archive``), a seal set, cleared or compared, and what garbage collection must
keep (every pointer, every claim that may be writing, the running rows).

Run by :mod:`resources.ledger.pointers` (the rules of every statement module are
:mod:`resources.ledger.statements`'). Nothing here executes; every function returns a
statement.
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from resources.ledger.statements import RUNNING, row_of
from resources.ledger.tables import checkpoint_archive, step_run


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
        .where(sa.and_(row_of(key), step_run.c.status != RUNNING))
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


def current_pointers() -> sa.Select[Any]:
    return sa.select(step_run.c.checkpoint_pointer).where(
        step_run.c.checkpoint_pointer.is_not(None)
    )


def every_archived_pointer() -> sa.Select[Any]:
    return sa.select(checkpoint_archive.c.pointer)


def claims_held() -> sa.Select[Any]:
    """Every claim (``run_id``, ``started_at``) whose attempt may be writing."""
    return sa.select(step_run.c.run_id, step_run.c.started_at).where(
        sa.and_(step_run.c.run_id.is_not(None), step_run.c.started_at.is_not(None))
    )


def running_keys() -> sa.Select[Any]:
    return sa.select(step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id).where(
        step_run.c.status == RUNNING
    )
