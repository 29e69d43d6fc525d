"""``storyboard status`` shows the spend (docs/DESIGN.md#money-budgets): per episode and per
project, today (UTC) and in all, in calls and in money, spent/limit where a money budget is
set; on the screen and in ``--json``. Read from the ledger filtered to the episodes shown
and their project, never another project's calls.

The shipped storyboard with offline models priced in ``project.yaml`` (text free, a picture
0.05), so the money is exact: offline replies report no usage, so every call keeps what was
reserved for it, and a picture reserves its price. ep01 runs (24 calls, 15 pictures: 0.75);
a call of ep01 yesterday (1.00), one of ep02 today (0.20) and one of another project today
(7.00) are planted in ``provider_call`` and counted in their projects' days (as recording
them would have). SQLite and PostgreSQL.
"""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from cli_helpers import CliEnv
from cli_homes import EPISODE, PARTITION, shipped

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.storyboard import sample_stories
from resources.ledger.store import engine_for
from resources.ledger.tables import project_day_spend, provider_call

# Noon, so "today" and "yesterday" are the days the planted calls name, whatever the hour.
NOW = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
PROJECT_YAML = """\
budget:
  max_cost_per_episode: 2.50
  max_cost_per_project_per_day: 40
pricing:
  offline-text-v1: {input_per_1m: 0, output_per_1m: 0}
  offline-image-v1: {per_image: {"*": 0.05}}
"""
OTHER = "ep02"


@pytest.fixture
def sent_sql() -> Iterator[list[str]]:
    """Every SQL statement any engine of this process sends while the test runs, with its
    parameters."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *args: Any) -> None:
        sent.append(f"{statement} -- {parameters!r}")

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)


def _call(project: str, episode: str, at: datetime, cost_micros: int) -> dict[str, Any]:
    stamp = format_timestamp(at)
    return {
        "project_id": project,
        "episode_id": episode,
        "step_id": "scene_image_pipeline",
        "run_id": "planted:0",
        "kind": "image",
        "units": 1,
        "model": "offline-image-v1",
        "at": stamp,
        "finished_at": stamp,
        "price": '{"model": "offline-image-v1"}',
        "reserved_micros": cost_micros,
        "cost_micros": cost_micros,
    }


@pytest.fixture
def spent(cli_db: CliEnv, monkeypatch: pytest.MonkeyPatch) -> CliEnv:
    cli = shipped(cli_db)
    project = cli.home / "projects" / EPISODE.project_id / "project.yaml"
    project.parent.mkdir(parents=True)
    project.write_text(PROJECT_YAML, encoding="utf-8")
    for episode in (EPISODE.episode_id, OTHER):
        cli.ok(
            "add-episode", "--project", EPISODE.project_id, "--episode", episode,
            "--story", str(sample_stories()[episode]),
        )  # fmt: skip
    cli.ok("materialize", "--partition", PARTITION)
    with engine_for(cli.db_url).begin() as conn:
        # What the run's calls counted in the project's day, as they were recorded.
        counted = conn.execute(
            sa.select(project_day_spend.c.calls, project_day_spend.c.cost_micros).where(
                project_day_spend.c.project_id == EPISODE.project_id
            )
        ).all()
        assert [tuple(row) for row in counted] == [(24, 750_000)], counted
        # The run's calls all today (noon), whenever the test runs.
        conn.execute(sa.update(provider_call).values(at=format_timestamp(NOW)))
        conn.execute(
            sa.insert(provider_call),
            [
                _call(EPISODE.project_id, EPISODE.episode_id, NOW - timedelta(days=1), 1_000_000),
                _call(EPISODE.project_id, OTHER, NOW, 200_000),
                _call("elsewhere", "ep01", NOW, 7_000_000),
            ],
        )
        # The planted calls counted in their projects' days, as recording them would have.
        day = sa.func.substr(provider_call.c.at, 1, 10)
        spent = sa.func.coalesce(provider_call.c.cost_micros, provider_call.c.reserved_micros)
        conn.execute(sa.delete(project_day_spend))
        conn.execute(
            sa.insert(project_day_spend).from_select(
                ["project_id", "day", "cost_micros", "calls", "priced"],
                sa.select(
                    provider_call.c.project_id,
                    day,
                    sa.func.sum(spent),
                    sa.func.count(),
                    sa.func.count(provider_call.c.price),
                ).group_by(provider_call.c.project_id, day),
            )
        )
    monkeypatch.setattr("pipeline_defs.operations.status_report.utc_now", lambda: NOW)
    return cli


def test_status_shows_the_spend_of_the_episode_and_its_project(spent: CliEnv) -> None:
    """Before: status showed calls per step only; money, today's spend and the budgets were
    nowhere."""
    payload = spent.json("status", "--partition", PARTITION)["spend"]
    assert payload["day"] == NOW.date().isoformat()
    (episode,) = payload["episodes"]
    assert episode["partition"] == PARTITION
    assert (episode["calls_today"], episode["calls_total"]) == (24, 25)
    assert (episode["cost_today_micros"], episode["cost_total_micros"]) == (750_000, 1_750_000)
    assert (episode["cost_today"], episode["cost_total"], episode["budget"]) == (
        "0.75", "1.75", "2.50",
    )  # fmt: skip
    (project,) = payload["projects"]
    assert project["project"] == EPISODE.project_id
    assert (project["calls_today"], project["calls_total"]) == (25, 26)
    assert (project["cost_today"], project["cost_total"], project["budget"]) == (
        "0.95", "1.95", "40.00",
    )  # fmt: skip

    screen = spent.ok("status", "--partition", PARTITION).output
    assert f"spend, today ({NOW.date().isoformat()} UTC) and in all:" in screen
    assert (
        "  project demo: today 25 calls 0.95 of 40.00 (max_cost_per_project_per_day); "
        "in all 26 calls 1.95"
    ) in screen
    assert (
        "  demo/ep01: today 24 calls 0.75; in all 25 calls 1.75 of 2.50 (max_cost_per_episode)"
    ) in screen
    assert "elsewhere" not in screen and "7.00" not in screen


def test_status_of_the_project_shows_each_episode(spent: CliEnv) -> None:
    payload = spent.json("status")["spend"]
    by_partition = {e["partition"]: e for e in payload["episodes"]}
    assert set(by_partition) == {PARTITION, f"{EPISODE.project_id}/{OTHER}"}
    other = by_partition[f"{EPISODE.project_id}/{OTHER}"]
    assert (other["calls_today"], other["calls_total"], other["cost_total"]) == (1, 1, "0.20")
    assert [p["project"] for p in payload["projects"]] == [EPISODE.project_id]
    assert payload["projects"][0]["cost_total"] == "1.95"


def test_the_spend_is_read_for_the_episode_and_its_project_only(
    spent: CliEnv, sent_sql: list[str]
) -> None:
    """The filter is the database's: every read of the calls names the episode or the
    project, and the other project's calls are never read."""
    spent.ok("status", "--partition", PARTITION)
    reads = [
        s for s in sent_sql if s.lstrip().upper().startswith("SELECT") and "FROM provider_call" in s
    ]
    spend_reads = [s for s in reads if "sum(" in s.lower()]
    assert len(spend_reads) == 1, spend_reads  # the episode's; the project's is its days'
    for statement in reads:
        where = statement.partition("WHERE")[2]
        assert "provider_call.project_id" in where, statement
    days = [s for s in sent_sql if "FROM project_day_spend" in s and "sum(" in s.lower()]
    assert len(days) == 1 and "project_day_spend.project_id IN" in days[0], days
    assert not any("elsewhere" in s for s in sent_sql)
