"""``storyboard status`` of some episodes reads their history and calls, not whole tables.

Measured on the real ledger (SQLite and PostgreSQL): every statement the command sends that
reads ``step_run``, ``step_transition``, ``provider_call`` or ``episode_calls`` is filtered by
episode. Before, the history and the calls were read whole and filtered in Python, whatever
the episodes asked for. ``benchmarks/status_scale.py`` shows the cost at 10,000 episodes.
"""

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from cli_helpers import CliEnv
from cli_homes import EPISODE, PARTITION, shipped

from pipeline_defs.storyboard import sample_stories

OTHER = "ep02"


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """Every SQL statement any engine of this process sends while the test runs."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)


def _reads_of(sent: list[str], table: str) -> list[str]:
    return [s for s in sent if s.lstrip().upper().startswith("SELECT") and f"FROM {table}" in s]


def test_status_of_one_episode_reads_only_its_history_and_calls(
    cli_db: CliEnv, statements: list[str]
) -> None:
    cli = shipped(cli_db)
    for episode in (EPISODE.episode_id, OTHER):
        cli.ok(
            "add-episode", "--project", EPISODE.project_id, "--episode", episode,
            "--story", str(sample_stories()[episode]),
        )  # fmt: skip
    cli.ok("materialize", "--partition", PARTITION)
    cli.ok("materialize", "--partition", f"{EPISODE.project_id}/{OTHER}")
    statements.clear()
    cli.ok("status", "--partition", PARTITION)
    for table in ("step_run", "step_transition", "provider_call", "episode_calls"):
        reads = _reads_of(statements, table)
        assert reads or table == "episode_calls", f"status read nothing of {table}"
        # The project's spend, which status shows beside the episode's, is read from its rows
        # per day, not from its calls (tests/cli/test_status_spend.py).
        unfiltered = [s for s in reads if "episode_id" not in s.partition("WHERE")[2]]
        assert unfiltered == [], f"status read {table} whole: {unfiltered}"
