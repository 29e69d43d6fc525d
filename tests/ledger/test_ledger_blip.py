"""A ledger that blinks: a dropped PostgreSQL connection costs no call.

- a real ``pg_terminate_backend`` of the store's sessions between two operations, and
  inside a fenced publish's transaction: the next operations succeed on a fresh connection,
  the checkpoint rename runs once, no provider call or claim is written twice;
- an answer lost after the server committed (the session ended right after the statement
  or the COMMIT ran): the retry recognises its own claim, its own provider-call row, its
  own audit row — nothing is doubled, no ``step.already_running`` against itself;
- a server of the test's own, stopped and started again while an operation retries: it
  succeeds; stopped past the retry budget: ``ledger.unavailable`` naming host:port/db,
  never the password, never ``[internal] OperationalError``;
- the lease's heartbeat survives a terminate of its session (no renewal lost);
- SQLite is never retried, and errors that are not a lost connection fail at once;
- end to end: a real ``storyboard materialize`` whose sessions are terminated during
  ``scene_detail`` completes, with as many provider calls as a clean run.

Sessions are found by the ``application_name`` each test sets in its URL, in the
database the test created: a test only ever terminates sessions it opened. The shared server
is never stopped; the outage tests start their own (tests/support/pg_throwaway.py).
"""

import logging
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from checkpoint_support import stored_row
from cli_helpers import CliEnv, make_env
from pg_throwaway import ThrowawayPostgres, wait_until

from pipeline_defs.resume.causes import root_cause, root_cause_of_text
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.steps.lease import Lease
from pipeline_defs.storyboard import sample_stories
from resources.ledger import retry
from resources.ledger.store import LedgerStore, engine_for
from resources.ledger.tables import provider_call, step_run, step_transition

KEY = StepKey("blip", "ep01", "scene_detail")
RUN = "run-1:attempt-a"
PASSWORD = "s3cr3t-Pa55word"


# --------------------------------------------------------------------------- helpers
@dataclass
class Blip:
    """A store on the shared server whose sessions (and only those) a test can end."""

    store: LedgerStore
    admin: sa.Engine
    database: str
    app: str

    def sessions(self) -> list[int]:
        with self.admin.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = :db AND application_name = :app"
                ),
                {"db": self.database, "app": self.app},
            ).all()
        return [int(r[0]) for r in rows]

    def kill(self, pids: list[int]) -> None:
        """``pg_terminate_backend`` and wait until the sessions are really gone."""
        with self.admin.connect() as conn:
            for pid in pids:
                conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        assert wait_until(lambda: not set(pids) & set(self.sessions()), 10), "sessions linger"

    def drop(self) -> int:
        """End every session the store holds (idle in its pool or in a transaction)."""
        pids = self.sessions()
        self.kill(pids)
        return len(pids)

    def rows(self, table: sa.Table) -> list[dict[str, Any]]:
        # Without our application_name (its sessions are the ones the test terminates).
        plain = sa.make_url(self.store.url).difference_update_query(["application_name"])
        engine = sa.create_engine(plain)
        try:
            with engine.connect() as conn:
                return [dict(r) for r in conn.execute(sa.select(table)).mappings()]
        finally:
            engine.dispose()


@pytest.fixture
def blip(pg_url: str, pg_server_url: str) -> Iterator[Blip]:
    app = f"blip-{uuid.uuid4().hex[:12]}"
    # Added to the query the URL may already carry (an embedded server's socket ``host``).
    url = (
        sa.make_url(pg_url)
        .update_query_dict({"application_name": app})
        .render_as_string(hide_password=False)
    )
    store = LedgerStore(url)
    store.migrate()
    admin = sa.create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    try:
        yield Blip(store, admin, sa.make_url(pg_url).database or "", app)
    finally:
        engine_for(url).dispose()
        admin.dispose()


def _driver(conn: Any) -> Any:
    """The psycopg connection behind a pooled one."""
    return getattr(conn, "driver_connection", None) or conn


def _lose_answer(blip: Blip, sql: Callable[[str], bool]) -> list[str]:
    """After the first statement matching ``sql`` ran (autocommit: committed), end the
    session and fail as the client sees it: the server did the work, the answer is lost."""
    fired: list[str] = []

    def after(_conn: Any, cursor: Any, statement: str, *_args: Any) -> None:
        if fired or not sql(statement):
            return
        fired.append(statement)
        blip.kill([cursor.connection.info.backend_pid])
        cursor.execute("SELECT 1")  # raises: the session is gone

    sa.event.listen(blip.store.engine, "after_cursor_execute", after)
    return fired


def _lose_commit_answer(blip: Blip, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The next COMMIT lands on the server, then the session ends before the client hears."""
    dialect = blip.store.engine.dialect
    real = dialect.do_commit
    fired: list[int] = []

    def do_commit(dbapi_connection: Any) -> None:
        real(dbapi_connection)
        if not fired:
            driver = _driver(dbapi_connection)
            fired.append(driver.info.backend_pid)
            blip.kill([driver.info.backend_pid])
            driver.execute("SELECT 1")

    monkeypatch.setattr(dialect, "do_commit", do_commit)
    return fired


def _inserts_into(table: sa.Table) -> Callable[[str], bool]:
    return lambda statement: statement.lstrip().startswith(f"INSERT INTO {table.name} ")


# --------------------------------------------------------------------------- dropped sessions
@pytest.mark.pg
def test_sessions_dropped_between_operations_cost_nothing(
    blip: Blip, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's failure: ``[internal] AdminShutdown … UPDATE provider_call`` when the
    server restarted during scene_detail, and the resume paid for the calls again."""
    store = blip.store
    assert store.claim(KEY, RUN)
    call = store.start_provider_call(KEY, RUN, kind="text")
    assert blip.drop() >= 1
    store.finish_provider_call(call, units=7, model="m")  # was: AdminShutdown
    assert blip.drop() >= 1
    second = store.start_provider_call(KEY, RUN, kind="text")
    assert blip.drop() >= 1
    store.finish_provider_call(second, units=5, model="m")
    assert blip.drop() >= 1
    assert store.heartbeat(KEY, RUN)
    assert blip.drop() >= 1
    assert store.transition(KEY, RUN, "completed", completed_count=2)
    assert blip.drop() >= 1
    assert stored_row(store, KEY).status == "completed"

    calls = blip.rows(provider_call)
    assert [(c["id"], c["units"]) for c in calls] == [(call, 7), (second, 5)]
    assert all(c["finished_at"] for c in calls)
    assert len(blip.rows(step_run)) == 1
    assert "connection lost during" in caplog.text  # the blip is logged, not hidden


@pytest.mark.pg
@pytest.mark.parametrize("via", ["transition", "publish"])
def test_a_session_dropped_inside_a_fenced_publish_reruns_the_lock_not_the_rename(
    blip: Blip, via: str
) -> None:
    """The publish's own session ends while the rename runs under its row lock: the COMMIT
    fails, the transaction is run again (lock, owner check, status) and the rename, done,
    is not repeated."""
    store = blip.store
    assert store.claim(KEY, RUN)
    renames: list[str] = []

    def rename() -> str:
        renames.append("checkpoint.json")
        assert blip.drop() >= 1  # this transaction's session, holding the row lock
        return "published"

    if via == "transition":
        assert store.transition(KEY, RUN, "completed", publish=rename)
    else:
        assert store.publish(KEY, RUN, rename) == "published"
        assert store.transition(KEY, RUN, "completed")
    assert renames == ["checkpoint.json"]
    row = store.get(KEY)
    assert row is not None and row.status == "completed" and row.run_id == RUN


@pytest.mark.pg
def test_a_publish_whose_row_was_taken_while_the_session_was_down_publishes_nothing(
    blip: Blip,
) -> None:
    """A retry re-checks the owner: a row no longer ours is still ``ownership_lost``."""
    store = blip.store
    assert store.claim(KEY, RUN)
    other = LedgerStore(
        sa.make_url(blip.store.url)
        .difference_update_query(["application_name"])
        .render_as_string(hide_password=False)
    )
    try:
        started = stored_row(store, KEY).started_at
        assert other.reset_running(KEY, started, "operator reset")
        assert other.claim(KEY, "run-2:attempt-a")  # the row has another owner now
    finally:
        engine_for(other.url).dispose()
    assert blip.drop() >= 1  # the publish starts on a dead pooled session
    ran: list[int] = []
    with pytest.raises(PipelineError) as lost:
        store.publish(KEY, RUN, lambda: ran.append(1))
    assert lost.value.code == "step.ownership_lost" and ran == []


# --------------------------------------------------------------------------- lost answers
@pytest.mark.pg
@pytest.mark.parametrize("seen", ["blind", "no_row"])
def test_a_claim_whose_answer_was_lost_recognises_its_own_win(blip: Blip, seen: str) -> None:
    store = blip.store
    fired = _lose_answer(blip, _inserts_into(step_run))
    kwargs: dict[str, Any] = {} if seen == "blind" else {"seen": None}
    assert store.claim(KEY, RUN, **kwargs)  # not step.already_running against itself
    assert fired, "the claim's answer was lost"
    (row,) = blip.rows(step_run)
    assert row["run_id"] == RUN and row["status"] == "running" and row["recovery_count"] == 0
    assert not store.claim(KEY, "run-2:attempt-a")  # a real rival still loses


@pytest.mark.pg
def test_a_stale_steal_whose_answer_was_lost_counts_one_recovery(blip: Blip) -> None:
    store = blip.store
    old = "2026-01-01T00:00:00.000000Z"
    assert store.claim(KEY, "dead:0", now=old)
    fired = _lose_answer(blip, _inserts_into(step_run))
    assert store.claim(
        KEY, RUN, allow_stale_steal=True, expected_started_at=old, expected_run_id="dead:0",
        expected_heartbeat_at=old, auto_recovery=True, reason="stale lease",
    )  # fmt: skip
    assert fired
    (row,) = blip.rows(step_run)
    assert row["run_id"] == RUN and row["recovery_count"] == 1


@pytest.mark.pg
def test_a_provider_call_whose_answer_was_lost_is_recorded_once(blip: Blip) -> None:
    store = blip.store
    assert store.claim(KEY, RUN)
    fired = _lose_answer(blip, _inserts_into(provider_call))
    call = store.start_provider_call(KEY, RUN, kind="image")
    assert fired, "the insert's answer was lost"
    store.finish_provider_call(call, units=1, model="img")
    calls = blip.rows(provider_call)
    assert [(c["id"], c["kind"], c["units"]) for c in calls] == [(call, "image", 1)]
    assert len(store.provider_calls(KEY)) == 1


@pytest.mark.pg
def test_an_audit_row_whose_answer_was_lost_is_written_once(blip: Blip) -> None:
    store = blip.store
    fired = _lose_answer(blip, _inserts_into(step_transition))
    seq = store.append_transition(
        KEY, action="rerun_self", from_status=None, to_status="running", run_id=RUN
    )
    assert fired
    audit = blip.rows(step_transition)
    assert [(a["transition_seq"], a["action"]) for a in audit] == [(seq, "rerun_self")]


@pytest.mark.pg
def test_an_adoption_whose_answer_was_lost_is_still_an_adoption(blip: Blip) -> None:
    store = blip.store
    fired = _lose_answer(blip, _inserts_into(step_run))
    assert store.adopt(KEY, RUN, summary="orphan checkpoint verified")
    assert fired and len(blip.rows(step_run)) == 1


@pytest.mark.pg
def test_a_fenced_publish_whose_commit_answer_was_lost_is_confirmed(
    blip: Blip, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = blip.store
    assert store.claim(KEY, RUN)
    fired = _lose_commit_answer(blip, monkeypatch)
    renames: list[int] = []
    assert store.transition(KEY, RUN, "completed", publish=lambda: renames.append(1))
    assert fired and renames == [1]
    (row,) = blip.rows(step_run)
    assert row["status"] == "completed" and row["run_id"] == RUN


# --------------------------------------------------------------------------- the lease
def _heartbeat(store: LedgerStore) -> str:
    row = store.get(KEY)
    assert row is not None and row.heartbeat_at is not None, row
    return row.heartbeat_at


def _renewed(lease: Lease, count: int) -> bool:
    return wait_until(lambda: lease.renewals >= count, 10)


@pytest.mark.pg
def test_the_heartbeat_survives_a_terminate_of_its_session(
    blip: Blip, caplog: pytest.LogCaptureFixture
) -> None:
    store = blip.store
    assert store.claim(KEY, RUN)
    log = logging.getLogger("test.lease")
    with Lease(store, KEY, RUN, interval_seconds=0.1, log=log) as lease:
        assert wait_until(lambda: lease.renewals >= 2, 10)
        for _ in range(2):
            before = lease.renewals
            beat = _heartbeat(store)
            assert blip.drop() >= 1
            assert _renewed(lease, before + 3)
            assert _heartbeat(store) > beat
        lease.check()  # not lost
    assert not lease.lost
    assert "lease renewal failed" not in caplog.text, "a renewal was lost to one blip"
    assert lease.failures == 0


# --------------------------------------------------------------------------- a real outage
@pytest.fixture(scope="module")
def own_server() -> Iterator[ThrowawayPostgres]:
    try:
        server = ThrowawayPostgres()
    except Exception as exc:  # no binaries: the shared-server tests above still run
        if os.environ.get("PIPELINE_REQUIRE_PG", "") not in ("", "0", "false"):
            pytest.fail(f"cannot start a throwaway PostgreSQL: {exc}", pytrace=False)
        pytest.skip(f"cannot start a throwaway PostgreSQL: {exc}")
    with server:
        yield server


@pytest.fixture
def outage_store(own_server: ThrowawayPostgres) -> Iterator[LedgerStore]:
    if not own_server.is_running():
        own_server.start()
    name = f"ledger_{uuid.uuid4().hex[:8]}"
    own_server.create_database(name)
    store = LedgerStore(own_server.url(name, password=PASSWORD))
    store.migrate()
    yield store
    engine_for(store.url).dispose()
    if not own_server.is_running():
        own_server.start()


def _restart_later(server: ThrowawayPostgres, seconds: float) -> threading.Thread:
    def restart() -> None:
        time.sleep(seconds)
        server.start()

    thread = threading.Thread(target=restart)
    thread.start()
    return thread


@pytest.mark.pg
def test_a_server_restart_during_an_operation_is_waited_out(
    own_server: ThrowawayPostgres, outage_store: LedgerStore
) -> None:
    store = outage_store
    assert store.claim(KEY, RUN)
    call = store.start_provider_call(KEY, RUN, kind="text")
    own_server.stop()  # every session ends; connections are refused until the start
    restarter = _restart_later(own_server, 0.7)
    started = time.monotonic()
    try:
        store.finish_provider_call(call, units=3, model="m")  # retries through the restart
    finally:
        restarter.join()
    assert time.monotonic() - started >= 0.5, "it did wait for the server"
    assert store.heartbeat(KEY, RUN)
    assert store.transition(KEY, RUN, "completed")
    (recorded,) = store.provider_calls(KEY)
    assert recorded["units"] == 3 and recorded["finished_at"]


@pytest.mark.pg
def test_an_outage_past_the_budget_is_ledger_unavailable_naming_the_server(
    own_server: ThrowawayPostgres, outage_store: LedgerStore
) -> None:
    store = outage_store
    assert store.claim(KEY, RUN)
    own_server.stop()
    started = time.monotonic()
    with pytest.raises(PipelineError) as info:
        store.heartbeat(KEY, RUN)
    elapsed = time.monotonic() - started
    error = info.value
    assert error.code == "ledger.unavailable" and error.status == 503
    database = sa.make_url(store.url).database
    assert f"127.0.0.1:{own_server.port}/{database}" in error.message
    assert "heartbeat" in error.message
    for text in (str(error), repr(error), repr(error.details), repr(error.as_metadata())):
        assert PASSWORD not in text
    budget = sum(retry.RETRY_PAUSES_SECONDS)
    assert budget - 0.5 <= elapsed <= budget + 10, elapsed
    assert isinstance(error.__cause__, sa.exc.OperationalError)  # the driver's error kept
    assert root_cause(error).code == "ledger.unavailable"  # never "[internal] OperationalError"
    own_server.start()
    assert store.heartbeat(KEY, RUN), "the store recovers once the server is back"


# --------------------------------------------------------------------------- not a blip
def test_only_a_lost_connection_counts_as_a_blip() -> None:
    locked = sa.exc.OperationalError("UPDATE", {}, sqlite3.OperationalError("database is locked"))
    assert not retry.is_dropped_connection(locked)
    assert retry.is_dropped_connection(
        sa.exc.OperationalError("UPDATE", {}, psycopg.errors.AdminShutdown("terminating"))
    )
    assert retry.is_dropped_connection(psycopg.OperationalError("connection refused"))
    assert retry.is_dropped_connection(psycopg.errors.CannotConnectNow("starting up"))
    assert not retry.is_dropped_connection(psycopg.errors.SerializationFailure("serialize"))
    assert not retry.is_dropped_connection(psycopg.errors.QueryCanceled("statement timeout"))
    assert not retry.is_dropped_connection(
        psycopg.OperationalError('connection failed: FATAL: database "x" does not exist')
    )
    assert not retry.is_dropped_connection(
        psycopg.OperationalError("FATAL: password authentication failed for user")
    )
    assert retry.server_name("postgresql+psycopg://u:pw@db.example:6543/ledger") == (
        "db.example:6543/ledger"
    )


def test_a_lost_ledger_that_escapes_the_store_is_still_typed() -> None:
    """A raw engine use (or a failure known only as text) names the outage, not
    ``[internal] OperationalError``; a missing database stays what it is."""
    refused = sa.exc.OperationalError(
        "SELECT 1",
        {},
        psycopg.OperationalError(
            'connection failed: connection to server at "127.0.0.1", port 5999 failed: '
            "Connection refused\n\tIs the server running on that host?"
        ),
    )
    cause = root_cause(refused, ledger="postgresql+psycopg://u:***@127.0.0.1:5999/db")
    assert cause.code == "ledger.unavailable" and "port 5999" in cause.message
    assert (
        root_cause_of_text(
            "OperationalError: (psycopg.errors.AdminShutdown) terminating connection due to "
            "administrator command [SQL: UPDATE provider_call SET units=...]"
        ).code
        == "ledger.unavailable"
    )
    missing = sa.exc.OperationalError(
        "SELECT 1",
        {},
        psycopg.OperationalError(
            'connection failed: connection to server at "h", port 1 failed: FATAL:  database '
            '"x" does not exist'
        ),
    )
    assert root_cause(missing).code == "internal"


def test_sqlite_is_never_retried(sqlite_url: str) -> None:
    store = LedgerStore(sqlite_url)
    calls: list[int] = []
    dropped = sa.exc.OperationalError(
        "UPDATE", {}, sqlite3.OperationalError("disk I/O error"), connection_invalidated=True
    )

    def body(attempt: int) -> None:
        calls.append(attempt)
        raise dropped

    with pytest.raises(sa.exc.OperationalError):
        store.session.retry("test", body)
    assert calls == [1]


@pytest.mark.pg
def test_a_missing_database_fails_at_once_not_as_an_outage(pg_server_url: str) -> None:
    missing = sa.make_url(pg_server_url).set(database=f"absent_{uuid.uuid4().hex[:8]}")
    store = LedgerStore(missing.render_as_string(hide_password=False))
    # Raised as the driver's error, not retried into ``ledger.unavailable`` (the retry
    # budget would wrap it): no wall-clock bound needed to tell the two apart.
    with pytest.raises(sa.exc.OperationalError, match="does not exist"):
        store.get(KEY)
    engine_for(store.url).dispose()


@pytest.mark.pg
def test_sessions_carry_an_application_name(pg_url: str, pg_server_url: str) -> None:
    """Operators (and tests) find a process's ledger sessions in pg_stat_activity."""
    store = LedgerStore(pg_url)
    store.migrate()
    with store.engine.connect() as conn:
        name = conn.exec_driver_sql("SHOW application_name").scalar()
    assert name == f"storyboard-ledger:{os.getpid()}"


# --------------------------------------------------------------------------- end to end
PARTITION = "demo/ep01"
UPSTREAM = ("story_source", "entity_canon", "world_guide")


def _storyboard(
    cli: CliEnv, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    script = str(Path(sys.executable).with_name("storyboard"))
    full = {**cli.subprocess_env(), **(env or {})}
    full.pop("STORYBOARD_DEFS", None)  # the shipped code location
    return subprocess.Popen(
        [script, *args],
        env=full,
        cwd=cli.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(cli: CliEnv, *args: str, env: dict[str, str] | None = None) -> str:
    process = _storyboard(cli, *args, env=env)
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, (out + err)[-3000:]
    return out + err


def _up_to_scene_detail(cli: CliEnv) -> None:
    episode = Episode.parse(PARTITION)
    _run(
        cli, "add-episode", "--project", episode.project_id, "--episode", episode.episode_id,
        "--story", str(sample_stories()["ep01"]),
    )  # fmt: skip
    steps = [arg for step in UPSTREAM for arg in ("--step", step)]
    _run(cli, "materialize", "--partition", PARTITION, *steps)


def _scene_calls(ledger: LedgerStore) -> list[dict[str, Any]]:
    return [c for c in ledger.provider_calls() if c["step_id"] == "scene_detail"]


def _call_started(ledger: LedgerStore, worker: Any, n: int) -> bool:
    """Wait until the worker has recorded its ``n``-th scene_detail call (or ended)."""
    return wait_until(
        lambda: len(_scene_calls(ledger)) >= n or worker.poll() is not None, 120, 0.05
    )


@pytest.mark.pg
@pytest.mark.slow
def test_a_materialize_whose_sessions_are_terminated_mid_scene_detail_pays_no_call_twice(
    tmp_path: Path, pg_url: str, pg_server_url: str
) -> None:
    (tmp_path / "clean").mkdir()
    (tmp_path / "blip").mkdir()
    clean = make_env(tmp_path / "clean")
    _up_to_scene_detail(clean)
    _run(clean, "materialize", "--partition", PARTITION, "--step", "scene_detail")
    expected = len(_scene_calls(clean.ledger))
    assert expected >= 1

    # The worker's sessions carry a name of this test's (its URL says so); this test reads
    # the ledger through other sessions, which it never terminates.
    app = f"blip-worker-{uuid.uuid4().hex[:12]}"
    url = (
        sa.make_url(pg_url)
        .update_query_dict({"application_name": app})
        .render_as_string(hide_password=False)
    )
    cli = make_env(tmp_path / "blip", url)
    reader = LedgerStore(pg_url)
    _up_to_scene_detail(cli)
    database = sa.make_url(pg_url).database
    admin = sa.create_engine(pg_server_url, isolation_level="AUTOCOMMIT")

    def terminate_worker_sessions() -> int:
        with admin.connect() as conn:
            ended = conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = :db AND application_name = :app"
                ),
                {"db": database, "app": app},
            ).all()
        return len(ended)

    env = {"PIPELINE_OFFLINE_LATENCY_MS": "1500"}
    worker = _storyboard(
        cli, "materialize", "--partition", PARTITION, "--step", "scene_detail", "--json", env=env
    )
    try:
        terminated = 0
        # During each provider call in flight (between its start and finish writes), end
        # every ledger session of the worker: the restart of the issue, seen from the client.
        for n in range(1, expected + 1):
            assert _call_started(reader, worker, n)
            if worker.poll() is not None:
                break
            time.sleep(0.3)
            terminated += terminate_worker_sessions()
        out, err = worker.communicate(timeout=600)
    finally:
        if worker.poll() is None:
            worker.kill()
        admin.dispose()
        engine_for(cli.db_url).dispose()
    assert worker.returncode == 0, (out + err)[-3000:]
    assert terminated >= 1, "the worker's sessions were terminated mid-step"
    assert "connection lost during" in out + err, "the worker retried (and said so)"
    row = reader.get(Episode.parse(PARTITION).step("scene_detail"))
    assert row is not None and row.status == "completed"
    calls = _scene_calls(reader)
    assert len(calls) == expected, (calls, expected)
    assert all(c["finished_at"] for c in calls)
