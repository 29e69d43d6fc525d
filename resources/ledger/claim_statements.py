"""The statements of a claim (docs/DESIGN.md#claims): the claim upsert, whose journal
lineage says whether the claim starts new work (docs/DESIGN.md#reply-journal); the inserts of
a row settled without a run (an adopted orphan checkpoint, a step that does not apply); and
the reads of a row's journal lineage.

Named here, run by :mod:`resources.ledger.claims` (the rules of every statement module are
:mod:`resources.ledger.statements`'). Nothing here executes; every function returns a
statement.
"""

import functools
import uuid
from typing import Any

import sqlalchemy as sa

from pipeline_defs.resume.errors import ErrorCode
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from resources.ledger.statements import KEY_COLUMNS, RUNNING, B, row_of, upsert
from resources.ledger.tables import step_run
from resources.ledger.transitions import status_guard

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
    insert = upsert(on_sqlite)(step_run).values(
        id=B("c_id"),
        project_id=B("k_project"),
        episode_id=B("k_episode"),
        step_id=B("k_step"),
        status=RUNNING,
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
        "status": RUNNING,
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
        index_elements=KEY_COLUMNS, set_=update, where=may_take
    ).returning(step_run.c.run_id)


def _settled_row(
    on_sqlite: bool, key: StepKey, run_id: str, status: StepStatus, summary: str, ts: str
) -> Any:
    """INSERT of a finished row (adoption, not-applicable) with every NOT NULL column."""
    return upsert(on_sqlite)(step_run).values(
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
        .on_conflict_do_nothing(index_elements=KEY_COLUMNS)
        .returning(step_run.c.id)
    )


def mark_not_applicable(on_sqlite: bool, key: StepKey, run_id: str, reason: str, ts: str) -> Any:
    """Upsert a not-applicable row; never over a running one (returns its id when written)."""
    return (
        _settled_row(on_sqlite, key, run_id, StepStatus.NOT_APPLICABLE, reason, ts)
        .on_conflict_do_update(
            index_elements=KEY_COLUMNS,
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
