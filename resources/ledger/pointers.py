"""Commit pointers of checkpoints on object storage, written inside a ledger transaction.

A step's published checkpoint on a bucket is the manifest in ``step_run.checkpoint_pointer``
(resources.checkpoints.manifest). These writes (their SQL named in
:mod:`resources.ledger.pointer_statements`) run inside the transaction of the
owner-aware transition that publishes (or of the review's compare-and-set on a victim),
after the row is locked, so the pointer, the status and the archive of the pointer it
replaces commit together or not at all: a worker that lost its row publishes nothing.

The replaced pointer goes to ``checkpoint_archive`` (the local store's ``archive/``) and
the newest ``keep`` archives of the step are kept; garbage collection reads every current
and archived pointer (:func:`referenced`) and keeps every object they name.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from pipeline_defs.resume.partition import StepKey
from resources.ledger import pointer_statements


def current_pointer(conn: Connection, key: StepKey) -> str | None:
    return conn.execute(pointer_statements.pointer_of(key)).scalar()


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
    conn.execute(pointer_statements.set_pointer(key, pointer))
    if previous is None:
        return
    conn.execute(
        pointer_statements.archive_pointer(key, previous, reason=reason, run_id=run_id, now=now)
    )
    old_ids = [row[0] for row in conn.execute(pointer_statements.archives_beyond(key, keep))]
    if old_ids:
        conn.execute(pointer_statements.drop_archives(old_ids))


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
    locked = conn.execute(pointer_statements.lock_settled_pointer(key)).first()
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
    locked = conn.execute(pointer_statements.lock_settled_pointer(key)).first()
    if locked is None or locked[0] is not None:
        return False
    conn.execute(pointer_statements.adopt_pointer(key, pointer, now=now))
    return True


def clear_seal(conn: Connection, key: StepKey, seal: str, *, now: str) -> bool:
    """Drop the seal ``seal`` from its row (a scrub found the storage no longer matches
    it), only while the row still carries exactly it: a run that sealed again since keeps
    its own. ``updated_at`` moves, so every judge's next look at the row goes the long way
    (the sensor's cursor notices the change)."""
    done = conn.execute(pointer_statements.clear_seal(key, seal, now=now))
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
    statement = pointer_statements.seal_unchanged(
        key, seal, run_id=run_id, updated_at=updated_at, pointer=pointer
    )
    done = conn.execute(statement)
    return bool(done.rowcount)


def clear_episode_seals(conn: Connection, project_id: str, episode_id: str, *, now: str) -> int:
    """Drop every seal of one episode's rows (its inputs were replaced in the storage)."""
    done = conn.execute(pointer_statements.clear_episode_seals(project_id, episode_id, now=now))
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
    current = conn.execute(pointer_statements.current_pointers())
    archived = conn.execute(pointer_statements.every_archived_pointer())
    claims = conn.execute(pointer_statements.claims_held())
    running = conn.execute(pointer_statements.running_keys())
    return References(
        pointers=[r[0] for r in current] + [r[0] for r in archived],
        claims=[(str(r[0]), str(r[1])) for r in claims],
        running=[StepKey(str(r[0]), str(r[1]), str(r[2])) for r in running],
    )


def archived_pointers(conn: Connection, key: StepKey) -> list[str]:
    """The step's archived pointers, newest first."""
    query = pointer_statements.archived_pointers(key)
    return [r[0] for r in conn.execute(query)]
