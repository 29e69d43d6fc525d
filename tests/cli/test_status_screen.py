"""``storyboard status`` answers the operator's question in one screen.

On the sample episode run end to end (offline models), ledger states are planted straight
into the tables: a running row whose owner renews its lease, one whose lease lapsed, a
failed row in backoff, a failed row whose recoveries are exhausted, a pending row waiting
on the one in backoff, and the audit rows of the last hour (twenty clean runs of 1 s to
20 s, three failures, an older failure). ``status --json`` sums them up under
``summary``; the printed view shows the same on at most 40 lines of 120 columns, and a
step another run is working on is neither counted nor shown as a block
(docs/DESIGN.md#leases).
"""

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from storyboard_support import EPISODE, PARTITION, Env, built_episode

from pipeline_defs.cli import main
from pipeline_defs.operations.status_summary import failure_code, last_hour
from pipeline_defs.operations.workspace import PARTITIONS_NAME
from pipeline_defs.resume.clock import format_timestamp
from resources.ledger.audit import Transition
from resources.ledger.tables import step_run, step_transition

WIDTH = 120
SCREEN_LINES = 40
# Long enough that a row planted as live is still live when the (slow, loaded) CLI judges
# it; the lapsed lease is half an hour old.
LEASE_SECONDS = "600"

LIVE = "scene_image_pipeline"  # a leaf: nothing downstream waits on it
LAPSED = "shot_dependency_t2i"
BACKOFF = "ref_image_gen"
EXHAUSTED = "t2i_review"
WAITING = "composite_image_gen"  # pending, downstream of the step in backoff
BACKOFF_ERROR = "[provider.retries_exhausted] gave up after 8 tries"
EXHAUSTED_ERROR = "[Errno 28] No space left on device: '/data/x'"  # an OSError's text


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """The sample episode with the states above planted (read-only for every test)."""
    with built_episode("status-screen") as built:
        env = built.clone()
        try:
            dagster_home = tmp_path_factory.mktemp("dagster_home")
            (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
            instance = dg.DagsterInstance.from_config(str(dagster_home))
            instance.add_dynamic_partitions(PARTITIONS_NAME, [PARTITION])
            instance.dispose()
            env.dagster_home = dagster_home
            plant(env, datetime.now(UTC))
            yield env
        finally:
            env.destroy()


def plant(env: Env, now: datetime) -> None:
    ledger = env.ledger

    def at(**delta: float) -> str:
        return format_timestamp(now + timedelta(**delta))

    def row(step: str, **values: Any) -> None:
        with ledger.engine.begin() as conn:
            where = (step_run.c.project_id == EPISODE.project_id) & (step_run.c.step_id == step)
            assert conn.execute(sa.update(step_run).where(where).values(**values)).rowcount == 1

    def ran(step: str, run_id: str, began: datetime, seconds: float, ending: str) -> None:
        """A claim, then ``ending`` = ``action:status:reason`` ``seconds`` later."""
        key = EPISODE.step(step)
        action, to_status, reason = ending.split(":", 2)
        ledger.append_transition(
            key, action="rerun_self", from_status="completed", to_status="running",
            run_id=run_id, now=format_timestamp(began),
        )  # fmt: skip
        ledger.append_transition(
            key, action=action, from_status="running", to_status=to_status, run_id=run_id,
            reason=reason, now=format_timestamp(began + timedelta(seconds=seconds)),
        )  # fmt: skip

    with ledger.engine.begin() as conn:  # the build's own runs: two hours ago
        conn.execute(sa.update(step_transition).values(at=at(hours=-2)))
    row(
        LIVE,
        status="running",
        run_id="live:0",
        lock_owner="host:1",
        started_at=at(minutes=-2),
        heartbeat_at=at(seconds=-1),
        updated_at=at(minutes=-2),
    )
    # ... and waits for the shared rate limit (docs/DESIGN.md#rate-limit) for 5 more minutes.
    ledger.rate_limits.note_wait(
        EPISODE.step(LIVE), "live:0", "https://api.example/v1", "gpt-x", at(minutes=5)
    )
    row(
        LAPSED,
        status="running",
        run_id="gone:0",
        lock_owner="host:2",
        started_at=at(minutes=-50),
        heartbeat_at=at(minutes=-30),
        updated_at=at(minutes=-30),
    )
    row(
        BACKOFF,
        status="failed",
        run_id="flaky:0",
        recovery_count=1,
        retry_not_before=at(hours=1),
        error_message=BACKOFF_ERROR,
        started_at=at(minutes=-6),
        completed_at=at(minutes=-5),
        updated_at=at(minutes=-5),
    )
    row(
        EXHAUSTED,
        status="failed",
        run_id="full:0",
        recovery_count=3,
        last_recovery_reason="auto recovery from failed",
        retry_not_before=None,
        error_message=EXHAUSTED_ERROR,
        started_at=at(minutes=-21),
        completed_at=at(minutes=-20),
        updated_at=at(minutes=-20),
    )
    row(WAITING, status="pending", run_id=None, updated_at=at(minutes=-40))
    for i in range(20):  # 1 s .. 20 s: p95 (nearest rank) 19 s, max 20 s
        ran(
            "story_source", f"ok{i}:0", now + timedelta(minutes=-50 + i), i + 1, "finish:completed:"
        )
    minutes = timedelta(minutes=1)
    ran(BACKOFF, "flaky:0", now - 6 * minutes, 60, f"failed:failed:{BACKOFF_ERROR}")
    ran(EXHAUSTED, "full:0", now - 21 * minutes, 60, f"failed:failed:{EXHAUSTED_ERROR}")
    # Every item failed: audited as a "finish" to failed. Five minutes, longer than any
    # clean run: a failure's duration is in neither p95 nor max.
    ran("world_guide", "allfail:0", now - 30 * minutes, 300, "finish:failed:0 of 3 items done")
    # Before the last hour.
    ran("entity_t2i", "old:0", now - 180 * minutes, 3600, "failed:failed:[provider.http_error] 500")


def storyboard(env: Env, *args: str) -> str:
    result = CliRunner().invoke(
        main,
        list(args),
        env={
            "PIPELINE_HOME": str(env.home),
            "PIPELINE_DB_URL": env.db_url,
            "DAGSTER_HOME": str(env.dagster_home),
            "PIPELINE_LEASE_SECONDS": LEASE_SECONDS,
            "COLUMNS": str(WIDTH),
        },
    )
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stdout


@pytest.fixture(scope="module")
def payload(planted: Env) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(storyboard(planted, "status", "--json"))
    return loaded


@pytest.fixture(scope="module")
def screen(planted: Env) -> str:
    return storyboard(planted, "status")


# --------------------------------------------------------------------------- --json
def test_the_queue_is_what_the_sensor_launches_or_waits_to_launch(
    payload: dict[str, Any],
) -> None:
    queue = payload["summary"]["queue"]
    assert (queue["launch"], queue["waiting"], queue["deferred"]) == (1, 1, 1), queue
    # The pending row planted 40 minutes ago is the oldest wait.
    assert 40 * 60 <= queue["oldest_wait_seconds"] < 45 * 60, queue
    assert queue["queued_runs"] == 0 and queue["oldest_queued_run_age_seconds"] is None
    verdicts = {s["step"]: s["verdict"] for s in payload["steps"]}
    assert (verdicts[LAPSED], verdicts[WAITING], verdicts[BACKOFF]) == (
        "launch",
        "waiting",
        "deferred",
    )


def test_leases_are_live_expired_or_in_backoff(payload: dict[str, Any]) -> None:
    assert payload["summary"]["leases"] == {
        "live": 1,
        "expired_not_reclaimed": 1,
        "in_backoff": 1,
    }
    steps = {s["step"]: s for s in payload["steps"]}
    assert 59 * 60 < steps[BACKOFF]["retry_in_seconds"] <= 60 * 60
    assert steps[EXHAUSTED]["retry_in_seconds"] is None


def test_a_healthy_running_step_is_not_counted_as_blocked(payload: dict[str, Any]) -> None:
    totals = payload["totals"]
    # The sensor's own tally (as ``decide`` prints it) and the count of blocks: only the
    # exhausted one is a block; the step another run holds is running.
    assert (totals["verdicts"]["blocked"], totals["verdicts"]["running"]) == (1, 1), totals
    assert totals["blocked"] == 1, totals
    live = next(s for s in payload["steps"] if s["step"] == LIVE)
    assert live["verdict"] == "running" and live["running_healthy"] is True
    assert 200 < live["rate_wait_seconds"] <= 300
    assert (live["block_code"], live["what_to_do"]) == (None, None)


def test_exhausted_recoveries_are_named(payload: dict[str, Any]) -> None:
    assert payload["summary"]["recovery_exhausted"] == [{"partition": PARTITION, "step": EXHAUSTED}]


def test_the_last_hour_counts_endings_codes_and_durations(payload: dict[str, Any]) -> None:
    hour = payload["summary"]["last_hour"]
    assert (hour["completed"], hour["partial"], hour["failed"]) == (20, 0, 3), hour
    assert hour["failure_codes"] == {
        "provider.retries_exhausted": 1,
        "step.execute_failed": 1,  # every item failed ("finish" to failed)
        "storage.full": 1,  # an OSError's text, typed by its errno
    }
    assert (hour["p95_claimed_seconds"], hour["max_claimed_seconds"]) == (19.0, 20.0)


def test_each_duration_is_named_for_what_it_measures(payload: dict[str, Any], screen: str) -> None:
    """Two measures, two names, the same on the screen and in --json: the step in its run
    (``run step``: its Dagster events, judging, inputs, body and publish) and its claim to
    its end (``claimed``: the ledger row and the history lines, which the last hour's p95
    and max are taken from). One name ("last dur") showed both, one beside the other."""
    state = next(s for s in payload["steps"] if s["step"] == BACKOFF)
    assert state["last_claimed_seconds"] == 60.0  # claimed 6 min ago, ended 5 min ago
    assert state["last_run_step_seconds"] is None  # the instance does not know its run
    assert not [k for s in payload["steps"] for k in s if "duration" in k]
    assert "p95_claimed_seconds" in payload and "p95_duration_seconds" not in payload
    assert "last dur" not in screen and "duration" not in screen, screen
    assert column(screen, "claimed")[BACKOFF] == "60.0s"
    assert column(screen, "run step")[BACKOFF] == "-"
    assert re.search(r"claimed p95 19\.0s\s+claimed max 20\.0s", screen), screen
    assert "claimed p95 per step:" in screen


# --------------------------------------------------------------------------- the screen
def test_the_screen_fits_120_columns_and_40_lines(screen: str) -> None:
    lines = screen.splitlines()
    assert len(lines) <= SCREEN_LINES, screen
    too_wide = [line for line in lines if len(line) > WIDTH]
    assert not too_wide, too_wide
    rows = [line for line in lines if line.startswith(f"{PARTITION} ")]
    assert len(rows) == 10, screen  # one line per step, whatever its state


def test_the_screen_prints_the_summary_before_the_settings(screen: str) -> None:
    lines = screen.splitlines()

    def index(prefix: str) -> int:
        found = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        assert len(found) == 1, (prefix, screen)
        return found[0]

    last_row = max(i for i, line in enumerate(lines) if line.startswith(f"{PARTITION} "))
    order = [
        index("running 2  blocked 1  failed 2"),
        index("queue: "),
        index("leases: "),
        index("recoveries exhausted "),
        index("last hour: "),
        index("settings in force: "),
    ]
    assert last_row < order[0] and order == sorted(order), screen
    assert re.match(
        r"queue: launch now 1  waiting 1  deferred 1  oldest wait 4\dm\d\ds  queued runs 0$",
        lines[index("queue: ")],
    ), screen
    assert lines[index("leases: ")] == (
        "leases: live 1  expired, not yet reclaimed 1  in backoff 1"
    )
    assert lines[index("recoveries exhausted ")] == (
        f"recoveries exhausted 1: {PARTITION} {EXHAUSTED}"
    )
    hour = index("last hour: ")
    text = " ".join(line.strip() for line in lines[hour : index("claimed p95 per step")])
    assert text == (
        "last hour: completed 20  partial 0  claimed p95 19.0s  claimed max 20.0s  failed 3: "
        "provider.retries_exhausted 1, step.execute_failed 1, storage.full 1"
    ), screen
    settings = " ".join(line.strip() for line in lines[index("settings in force: ") :])
    assert f"lease_seconds={LEASE_SECONDS} (env)" in settings


def test_the_screen_shows_a_live_lease_as_running_not_as_a_block(screen: str) -> None:
    sensor_now = column(screen, "sensor now")
    # A step waiting for the rate limit is running; the screen says what it waits for.
    assert re.fullmatch(r"rate limit, (2\d\d|300)s", sensor_now[LIVE]), sensor_now
    assert sensor_now[EXHAUSTED] == "blocked"
    assert re.fullmatch(r"deferred (59m\d\ds|1h00m)", sensor_now[BACKOFF]), sensor_now
    assert "is working on it" not in screen  # no "what to do" for a live lease
    blocks = [line for line in screen.splitlines() if line.startswith("    block: ")]
    assert len(blocks) == 1 and "recovery exhausted" in blocks[0], screen
    assert f"storyboard force --partition {PARTITION} --step {EXHAUSTED}" in screen


def column(text: str, header: str) -> dict[str, str]:
    """step → the value in ``header``'s column of the rendered table."""
    lines = text.splitlines()
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]
    start, end = spans[[lines[0][a:b].strip() for a, b in spans].index(header)]
    return {
        line.split()[1]: line[start:end].strip()
        for line in lines[2:]
        if line.startswith(f"{PARTITION} ")
    }


# --------------------------------------------------------------------------- the pieces
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def _audit(
    step: str, action: str, from_status: str | None, to_status: str, run_id: str | None,
    minutes: float, reason: str | None = None,
) -> Transition:  # fmt: skip
    return Transition.from_row({
        "transition_seq": 0, "project_id": "p", "episode_id": "e", "step_id": step,
        "action": action, "from_status": from_status, "to_status": to_status, "origin": None,
        "reason": reason, "run_id": run_id, "launch_path": None,
        "at": format_timestamp(NOW + timedelta(minutes=minutes)),
    })  # fmt: skip


def test_last_hour_times_a_takeover_from_its_own_claim_and_names_a_reset() -> None:
    audit = [
        _audit("a", "rerun_self", "failed", "running", "first:0", -50),
        # the lease lapsed; another run took the row over 10 minutes later
        _audit("a", "stale_running_recovery", "running", "running", "second:0", -40),
        _audit("a", "finish", "running", "partial", "second:0", -39),
        _audit("b", "rerun_self", "completed", "running", "stuck:0", -30),
        _audit("b", "reset_running", "running", "failed", None, -20, "reset by an operator"),
        _audit("c", "finish", "running", "completed", "unclaimed:0", -10),  # no claim seen
        _audit("d", "rerun_self", "completed", "running", "late:0", -62),
        _audit("d", "failed", "running", "failed", "late:0", -61, "[internal] boom"),
    ]
    hour = last_hour(audit, NOW)
    assert (hour.completed, hour.partial, hour.failed) == (1, 1, 1)
    assert hour.failure_codes == (("reset_running", 1),)
    assert (hour.p95_claimed_seconds, hour.max_claimed_seconds) == (60.0, 60.0)
    assert hour.since == "2026-06-01T11:00:00.000000Z"


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("[provider.no_key] no key in OPENAI_API_KEY", "provider.no_key"),
        ("[internal] ValueError: x", "internal"),
        ("[Errno 28] No space left on device: '/x'", "storage.full"),
        ("[Errno 2] No such file or directory: '/x'", "internal"),
        ("database or disk is full", "storage.full"),
        ("boom", "internal"),
        (None, "internal"),
    ],
)
def test_a_failure_recorded_as_text_keeps_its_code(text: str | None, code: str) -> None:
    assert failure_code(text) == code


def test_status_names_the_run_that_holds_a_partitions_queue(planted: Env) -> None:
    """The shipped run queue starts one run per partition: a run left STARTED (its worker
    killed) holds the slot while the recovery waits behind it. ``status`` names that run,
    how many wait behind it, and what the ledger says of its worker. (A QUEUED run needs a
    code location origin to be stored, so the waiting run is handed over as the queue query
    would return it.)"""
    import uuid

    from pipeline_defs.cli.commands_status import _holder_line
    from pipeline_defs.operations.status_report import queue_holders

    env = planted.clone()
    try:
        dagster_home = env.root / "dagster_home_queue"
        dagster_home.mkdir()
        (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
        instance = dg.DagsterInstance.from_config(str(dagster_home))
        tags = {"dagster/partition": PARTITION}
        holder = dg.DagsterRun(
            job_name="resume_steps",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.STARTED,
            tags=tags,
        )
        instance.add_run(holder)
        waiting = dg.DagsterRun(job_name="resume_steps", run_id=str(uuid.uuid4()), tags=tags)
        with env.ledger.engine.begin() as conn:  # the lapsed claim is the holder's
            conn.execute(
                sa.update(step_run)
                .where(step_run.c.step_id == LAPSED)
                .values(run_id=f"{holder.run_id}:0")
            )
        (held,) = queue_holders(env.ledger, instance, [waiting], datetime.now(UTC))
        instance.dispose()
        assert (held.partition, held.run_id, held.status) == (PARTITION, holder.run_id, "STARTED")
        assert held.queued_behind == 1 and held.claims == 1
        assert held.claims_silent_seconds is not None
        assert held.claims_silent_seconds >= 29 * 60  # the heartbeat planted 30 min ago
        line = _holder_line(held, lease_seconds=60, heartbeat_seconds=10)
        assert f"run {holder.run_id} (STARTED) holds the queue, 1 run waiting" in line, line
        assert "stopped heartbeating 3" in line, line
        assert "marks it failed once silent 1m10s" in line, line
    finally:
        env.destroy()
