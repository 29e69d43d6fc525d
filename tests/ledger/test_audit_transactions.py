"""An edit of a settled row and an invalidation write their history line in their own
transaction (docs/DESIGN.md#audit), on real SQLite and real PostgreSQL:

- a line the database refuses (a real ``BEFORE INSERT`` trigger, tests/support/audit_faults.py)
  rolls the whole unit back: no seal, no pointer, no status, and the edit's side effect
  (the checkpoint rename) never runs;
- a refused edit (the row running, absent, or the compare-and-set failing) leaves an
  ``edit_refused`` line and nothing else;
- after a lost commit (PostgreSQL: the COMMIT landed, the session ended before its answer)
  the retried unit writes no second line.
"""

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from audit_faults import refusing_audit

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from resources.ledger.audit import Audit, AuditAction, Transition
from resources.ledger.store import LedgerStore, engine_for

KEY = StepKey("proj", "ep1", "scene_detail")
RUN = "review-run:0"
EDIT = Audit(AuditAction.MUTATED, None, None, reason="fixed by t2i_review", run_id=RUN)
REFUSED = Audit(AuditAction.EDIT_REFUSED, None, None, reason="edit refused", run_id=RUN)
INVALIDATE = Audit(AuditAction.INVALIDATE, None, None, reason="forced upstream", run_id=RUN)


def settled(store: LedgerStore, status: str = "completed", seal: str = "seal-before") -> None:
    assert store.claim(KEY, "owner:0")
    assert store.transition(KEY, "owner:0", status, seal=seal if status == "completed" else None)


def lines(store: LedgerStore, action: AuditAction) -> list[Transition]:
    return [t for t in store.transitions(KEY) if t.action == action.value]


def changed_since_read() -> None:
    raise PipelineError(ErrorCode.MUTATION_VICTIM_CHANGED, f"{KEY}: changed since it was read")


# --------------------------------------------------------------------------- one transaction
def test_an_edit_writes_its_line_with_the_row_status(store: LedgerStore) -> None:
    settled(store)
    ran: list[int] = []
    store.with_settled_row(
        KEY, lambda: ran.append(1), check=lambda: None, reseal=True, seal="seal-after", audit=EDIT
    )
    assert ran == [1]
    row = store.get(KEY)
    assert row is not None and row.checkpoint_seal == "seal-after"
    (line,) = lines(store, AuditAction.MUTATED)
    assert (line.from_status, line.to_status, line.run_id) == (
        "completed",
        "completed",
        RUN,
    )


def test_an_edit_whose_line_is_refused_changes_nothing(store: LedgerStore, db_url: str) -> None:
    settled(store)
    before = store.get(KEY)
    ran: list[int] = []
    with refusing_audit(db_url, AuditAction.MUTATED.value), pytest.raises(sa.exc.DBAPIError):
        store.with_settled_row(
            KEY,
            lambda: ran.append(1),
            reseal=True,
            seal="seal-after",
            pointer="manifest-after",
            audit=EDIT,
        )
    assert ran == []  # the rename never ran
    assert store.get(KEY) == before  # seal and pointer as they were
    assert lines(store, AuditAction.MUTATED) == []


def test_an_invalidation_whose_line_is_refused_stales_nothing(
    store: LedgerStore, db_url: str
) -> None:
    settled(store)
    before = store.get(KEY)
    with refusing_audit(db_url, AuditAction.INVALIDATE.value), pytest.raises(sa.exc.DBAPIError):
        store.invalidate([KEY], "forced upstream", audit=INVALIDATE)
    assert store.get(KEY) == before
    assert store.invalidate([KEY], "forced upstream", audit=INVALIDATE) == [KEY]
    row = store.get(KEY)
    assert row is not None and row.status == "stale" and row.checkpoint_seal is None
    (line,) = lines(store, AuditAction.INVALIDATE)
    assert (line.from_status, line.to_status) == ("completed", "stale")


# --------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("status", "code"),
    [
        ("running", ErrorCode.STEP_VICTIM_RUNNING),
        ("failed", ErrorCode.STEP_VICTIM_NOT_SETTLED),
        (None, ErrorCode.STEP_VICTIM_NOT_SETTLED),
    ],
    ids=["running", "failed", "absent"],
)
def test_an_edit_of_a_row_without_a_settled_result_is_refused_and_recorded(
    store: LedgerStore, status: str | None, code: ErrorCode
) -> None:
    if status == "running":
        assert store.claim(KEY, "owner:0")
    elif status is not None:
        settled(store, status)
    before = store.get(KEY)
    ran: list[int] = []
    with pytest.raises(PipelineError) as refused:
        store.with_settled_row(
            KEY, lambda: ran.append(1), reseal=True, seal="x", audit=EDIT, refused=REFUSED
        )
    assert refused.value.code == code and ran == []
    assert store.get(KEY) == before
    assert lines(store, AuditAction.MUTATED) == []
    (line,) = lines(store, AuditAction.EDIT_REFUSED)
    assert (line.from_status, line.to_status) == (status, status)
    assert (line.reason or "").startswith("edit refused: ") and line.run_id == RUN


def test_an_edit_whose_compare_and_set_fails_is_refused_and_recorded(store: LedgerStore) -> None:
    settled(store)
    before = store.get(KEY)
    ran: list[int] = []
    with pytest.raises(PipelineError) as refused:
        store.with_settled_row(
            KEY,
            lambda: ran.append(1),
            check=changed_since_read,
            reseal=True,
            seal="seal-after",
            audit=EDIT,
            refused=REFUSED,
        )
    assert refused.value.code == ErrorCode.MUTATION_VICTIM_CHANGED and ran == []
    assert store.get(KEY) == before
    (line,) = lines(store, AuditAction.EDIT_REFUSED)
    assert "changed since it was read" in (line.reason or "")
    assert lines(store, AuditAction.MUTATED) == []


# --------------------------------------------------------------------------- lost commits
def lose_next_commit(store: LedgerStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The next COMMIT lands on the server, then the session is closed before the client
    hears of it: the store sees a dropped connection and runs the unit again."""
    dialect = store.engine.dialect
    real = dialect.do_commit
    fired: list[int] = []

    def do_commit(dbapi_connection: Any) -> None:
        real(dbapi_connection)
        if not fired:
            driver = getattr(dbapi_connection, "driver_connection", None) or dbapi_connection
            fired.append(1)
            driver.close()
            driver.execute("SELECT 1")  # raises: the connection is closed

    monkeypatch.setattr(dialect, "do_commit", do_commit)
    return fired


@pytest.fixture
def pg_store(pg_url: str) -> Any:
    ledger = LedgerStore(pg_url)
    ledger.migrate()
    yield ledger
    engine_for(pg_url).dispose()


Edit = Callable[[LedgerStore, list[int]], None]


def _edit(store: LedgerStore, ran: list[int]) -> None:
    store.with_settled_row(
        KEY, lambda: ran.append(1), check=lambda: None, reseal=True, seal="s", audit=EDIT
    )


def _edit_with_pointer(store: LedgerStore, ran: list[int]) -> None:
    store.with_settled_row(
        KEY, lambda: ran.append(1), reseal=True, seal="s", pointer="manifest-after", audit=EDIT
    )


def _refused_edit(store: LedgerStore, ran: list[int]) -> None:
    with pytest.raises(PipelineError):
        store.with_settled_row(
            KEY, lambda: ran.append(1), check=changed_since_read, audit=EDIT, refused=REFUSED
        )


def _invalidate(store: LedgerStore, ran: list[int]) -> None:
    assert store.invalidate([KEY], "forced upstream", audit=INVALIDATE) == [KEY]


@pytest.mark.pg
@pytest.mark.parametrize(
    ("unit", "action", "runs"),
    [
        (_edit, AuditAction.MUTATED, [1]),
        (_edit_with_pointer, AuditAction.MUTATED, [1]),
        (_refused_edit, AuditAction.EDIT_REFUSED, []),
        (_invalidate, AuditAction.INVALIDATE, []),
    ],
    ids=["edit", "edit-with-pointer", "refused-edit", "invalidate"],
)
def test_a_unit_retried_after_a_lost_commit_writes_one_line(
    pg_store: LedgerStore,
    monkeypatch: pytest.MonkeyPatch,
    unit: Edit,
    action: AuditAction,
    runs: list[int],
) -> None:
    settled(pg_store)
    fired = lose_next_commit(pg_store, monkeypatch)
    ran: list[int] = []
    unit(pg_store, ran)
    assert fired, "the commit's answer was lost"
    assert ran == runs  # the edit's side effect ran at most once
    assert len(lines(pg_store, action)) == 1
