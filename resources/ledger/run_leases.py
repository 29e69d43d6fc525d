"""Run leases (docs/DESIGN.md#run-leases): a run's coordinator proves it is alive.

A step's lease says its worker lives; a run's lease says the process that hands the run's
steps out lives. The coordinator takes it when it starts, renews it every heartbeat and ends
it when it finishes; the resume sensor ends, in Dagster, a run whose lease stopped being
renewed, and never one whose lease is fresh, however long its steps wait in a queue.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.engine import Connection

from resources.ledger import run_lease_statements
from resources.ledger.audit import worker
from resources.ledger.session import LedgerSession, now_text


@dataclass(frozen=True)
class RunLeaseRow:
    """A ``run_lease`` row as read back."""

    run_id: str
    started_at: str
    heartbeat_at: str
    ended_at: str | None
    worker: str


class RunLeases:
    """The ``run_lease`` table."""

    def __init__(self, session: LedgerSession) -> None:
        self.session = session

    def begin_run(self, run_id: str, now: str | None = None) -> None:
        """Take ``run_id``'s lease for this process (again, if a coordinator resumes it)."""
        statement = run_lease_statements.begin_run_lease(
            self.session.is_sqlite, run_id, now=now or now_text(), worker=worker()
        )
        self.session.in_single("begin a run lease", lambda conn: conn.execute(statement))

    def renew_run(self, run_id: str, now: str | None = None) -> bool:
        """Renew ``run_id``'s lease; False when it is ended (or was never taken)."""
        statement = run_lease_statements.renew_run_lease(run_id, now=now or now_text())
        return self.session.in_single(
            "renew a run lease", lambda conn: conn.execute(statement).rowcount == 1
        )

    def end_run(self, run_id: str, now: str | None = None) -> bool:
        """End ``run_id``'s lease (its coordinator finished, or its run was ended)."""
        statement = run_lease_statements.end_run_lease(run_id, now=now or now_text())
        return self.session.in_single(
            "end a run lease", lambda conn: conn.execute(statement).rowcount == 1
        )

    def run_leases(
        self, run_ids: Sequence[str] | None = None, *, open_only: bool = False
    ) -> dict[str, RunLeaseRow]:
        """Run leases by run id (of ``run_ids``, or all; only open ones with ``open_only``)."""
        query = run_lease_statements.run_leases(run_ids, open_only=open_only)

        def read(conn: Connection) -> dict[str, RunLeaseRow]:
            rows = conn.execute(query).mappings()
            return {
                str(r["run_id"]): RunLeaseRow(
                    run_id=str(r["run_id"]),
                    started_at=str(r["started_at"]),
                    heartbeat_at=str(r["heartbeat_at"]),
                    ended_at=None if r["ended_at"] is None else str(r["ended_at"]),
                    worker=str(r["worker"]),
                )
                for r in rows
            }

        return self.session.in_read("read run leases", read)
