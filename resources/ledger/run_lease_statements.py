"""The statements of the ``run_lease`` table (docs/DESIGN.md#run-leases): a run's lease
taken, renewed, ended and read.

Run by :mod:`resources.ledger.run_leases` (the rules of every statement module are
:mod:`resources.ledger.statements`'). Nothing here executes; every function returns a
statement.
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from resources.ledger.statements import upsert
from resources.ledger.tables import run_lease


def begin_run_lease(on_sqlite: bool, run_id: str, *, now: str, worker: str) -> Any:
    """A run's lease, taken (or taken again: a resumed run's new coordinator) at ``now``."""
    values = {"run_id": run_id, "started_at": now, "heartbeat_at": now, "worker": worker}
    insert = upsert(on_sqlite)(run_lease).values(values)
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
