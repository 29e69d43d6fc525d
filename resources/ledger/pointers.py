"""Commit pointers of checkpoints on object storage, written inside a ledger transaction.

A step's published checkpoint on a bucket is the manifest in ``step_run.checkpoint_pointer``
(resources.checkpoints.manifest). These statements run inside the transaction of the
owner-aware transition that publishes (or of the review's compare-and-set on a victim),
after the row is locked, so the pointer, the status and the archive of the pointer it
replaces commit together or not at all: a worker that lost its row publishes nothing.

The replaced pointer goes to ``checkpoint_archive`` (the local store's ``archive/``) and
the newest ``keep`` archives of the step are kept; garbage collection reads every current
and archived pointer (:func:`referenced`) and keeps every object they name.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from resources.ledger.tables import checkpoint_archive, step_run


def _where(key: StepKey) -> sa.ColumnElement[bool]:
    return sa.and_(
        step_run.c.project_id == key.project_id,
        step_run.c.episode_id == key.episode_id,
        step_run.c.step_id == key.step_id,
    )


def _archive_where(key: StepKey) -> sa.ColumnElement[bool]:
    return sa.and_(
        checkpoint_archive.c.project_id == key.project_id,
        checkpoint_archive.c.episode_id == key.episode_id,
        checkpoint_archive.c.step_id == key.step_id,
    )


def current_pointer(conn: Connection, key: StepKey) -> str | None:
    return conn.execute(sa.select(step_run.c.checkpoint_pointer).where(_where(key))).scalar()


def set_pointer(
    conn: Connection,
    key: StepKey,
    pointer: str | None,
    *,
    previous: str | None,
    reason: str,
    run_id: str | None,
    keep: int,
    now: str,
) -> None:
    """Store ``pointer`` on the (already locked) row; archive ``previous`` if it differs.

    The caller holds the row lock and has checked ownership (or the compare-and-set): this
    only writes. ``pointer=None`` takes the checkpoint out of service (a force), keeping
    the old pointer in the archive.
    """
    if pointer == previous:
        return
    conn.execute(sa.update(step_run).where(_where(key)).values(checkpoint_pointer=pointer))
    if previous is None:
        return
    conn.execute(
        sa.insert(checkpoint_archive).values(
            project_id=key.project_id,
            episode_id=key.episode_id,
            step_id=key.step_id,
            pointer=previous,
            reason=reason,
            run_id=run_id,
            archived_at=now,
        )
    )
    stale = (
        sa.select(checkpoint_archive.c.id)
        .where(_archive_where(key))
        .order_by(checkpoint_archive.c.id.desc())
        .offset(max(keep, 0))
    )
    old_ids = [row[0] for row in conn.execute(stale)]
    if old_ids:
        conn.execute(sa.delete(checkpoint_archive).where(checkpoint_archive.c.id.in_(old_ids)))


def replace_pointer(
    conn: Connection,
    key: StepKey,
    pointer: str | None,
    *,
    reason: str,
    run_id: str | None,
    keep: int,
    now: str,
) -> None:
    """:func:`set_pointer` over whatever the (already locked) row names now."""
    set_pointer(
        conn,
        key,
        pointer,
        previous=current_pointer(conn, key),
        reason=reason,
        run_id=run_id,
        keep=keep,
        now=now,
    )


def swap_pointer(
    conn: Connection,
    key: StepKey,
    *,
    expected: str,
    pointer: str,
    reason: str,
    run_id: str | None,
    keep: int,
    now: str,
) -> bool:
    """Compare-and-set on a settled row's pointer (the review's edit of a victim): applied
    only while the row is not running and still names ``expected``; False otherwise."""
    locked = conn.execute(
        sa.select(step_run.c.checkpoint_pointer)
        .where(sa.and_(_where(key), step_run.c.status != StepStatus.RUNNING.value))
        .with_for_update()
    ).first()
    if locked is None or locked[0] != expected:
        return False
    set_pointer(
        conn, key, pointer, previous=expected, reason=reason, run_id=run_id, keep=keep, now=now
    )
    return True


def adopt_pointer(conn: Connection, key: StepKey, pointer: str, *, now: str) -> bool:
    """Give a settled row that publishes nothing yet its first pointer (a home moved into a
    bucket): only while the row is not running and names no pointer. Its seal, which names
    files of the old home, is cleared in the same statement: judged the long way next."""
    locked = conn.execute(
        sa.select(step_run.c.checkpoint_pointer)
        .where(sa.and_(_where(key), step_run.c.status != StepStatus.RUNNING.value))
        .with_for_update()
    ).first()
    if locked is None or locked[0] is not None:
        return False
    conn.execute(
        sa.update(step_run)
        .where(_where(key))
        .values(checkpoint_pointer=pointer, checkpoint_seal=None, updated_at=now)
    )
    return True


def clear_seal(conn: Connection, key: StepKey, seal: str, *, now: str) -> bool:
    """Drop the seal ``seal`` from its row (a scrub found the storage no longer matches
    it), only while the row still carries exactly it: a run that sealed again since keeps
    its own. ``updated_at`` moves, so every judge's next look at the row goes the long way
    (the sensor's cursor notices the change)."""
    done = conn.execute(
        sa.update(step_run)
        .where(sa.and_(_where(key), step_run.c.checkpoint_seal == seal))
        .values(checkpoint_seal=None, updated_at=now)
    )
    return bool(done.rowcount)


def seal_unchanged(
    conn: Connection,
    key: StepKey,
    seal: str,
    *,
    run_id: str | None,
    updated_at: str | None,
    pointer: str | None,
) -> bool:
    """Give a completed, unsealed row the seal of the checkpoint just verified clean
    (``storyboard seal``), only while the row is exactly as it was read: still completed,
    still unsealed, the same ``run_id``, ``updated_at`` and commit pointer. A run that
    claimed or settled it since, a mutator that re-sealed it, a move into a bucket: the
    row is left alone. ``updated_at`` does not move: a seal changes no verdict, and a run
    that judged the row meanwhile must not lose its claim's compare-and-set over it."""
    done = conn.execute(
        sa.update(step_run)
        .where(
            sa.and_(
                _where(key),
                step_run.c.status == StepStatus.COMPLETED.value,
                step_run.c.checkpoint_seal.is_(None),
                step_run.c.run_id.is_not_distinct_from(sa.literal(run_id, sa.String)),
                step_run.c.updated_at.is_not_distinct_from(sa.literal(updated_at, sa.Text)),
                step_run.c.checkpoint_pointer.is_not_distinct_from(sa.literal(pointer, sa.Text)),
            )
        )
        .values(checkpoint_seal=seal)
    )
    return bool(done.rowcount)


def clear_episode_seals(conn: Connection, project_id: str, episode_id: str, *, now: str) -> int:
    """Drop every seal of one episode's rows (its inputs were replaced in the storage)."""
    done = conn.execute(
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
    return int(done.rowcount or 0)


@dataclass(frozen=True)
class References:
    """What garbage collection must keep: every pointer any row names (current and
    archived) and every claim (``run_id``, ``started_at``) whose attempt may be writing."""

    pointers: Sequence[str]
    claims: Sequence[tuple[str, str]]
    # Steps whose row is running: an attempt of theirs may be uploading right now.
    running: Sequence[StepKey] = ()


def referenced(conn: Connection) -> References:
    current = conn.execute(
        sa.select(step_run.c.checkpoint_pointer).where(step_run.c.checkpoint_pointer.is_not(None))
    )
    archived = conn.execute(sa.select(checkpoint_archive.c.pointer))
    claims = conn.execute(
        sa.select(step_run.c.run_id, step_run.c.started_at).where(
            sa.and_(step_run.c.run_id.is_not(None), step_run.c.started_at.is_not(None))
        )
    )
    running = conn.execute(
        sa.select(step_run.c.project_id, step_run.c.episode_id, step_run.c.step_id).where(
            step_run.c.status == StepStatus.RUNNING.value
        )
    )
    return References(
        pointers=[r[0] for r in current] + [r[0] for r in archived],
        claims=[(str(r[0]), str(r[1])) for r in claims],
        running=[StepKey(str(r[0]), str(r[1]), str(r[2])) for r in running],
    )


def archived_pointers(conn: Connection, key: StepKey) -> list[str]:
    """The step's archived pointers, newest first."""
    query = (
        sa.select(checkpoint_archive.c.pointer)
        .where(_archive_where(key))
        .order_by(checkpoint_archive.c.id.desc())
    )
    return [r[0] for r in conn.execute(query)]
