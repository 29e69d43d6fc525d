"""The status-transition diagram (docs/DESIGN.md#status-transitions) is the ledger's table
(``resources/ledger/transitions.py``), and the store moves exactly what the table allows.

The diagram is parsed, not rendered: each line of its mermaid block is a header, a comment or
one edge ``from --> to : operation``; any other line fails the parse, so an edge cannot hide
in a line the parser skips.
"""

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import sqlalchemy as sa

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from resources.ledger.store import LedgerStore
from resources.ledger.tables import step_run
from resources.ledger.transitions import START, TRANSITIONS, Move, edges

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md"
ANCHOR = '<a id="status-transitions"></a>'
EDGE = re.compile(r"^(\[\*\]|[a-z_]+) --> ([a-z_]+) : ([a-z_]+)$")
HEADER = re.compile(r"^(stateDiagram-v2|direction (LR|RL|TB|BT)|%%.*)$")

Edge = tuple[str, str, str]

T0 = "2026-11-30T10:00:00.000000Z"
T1 = "2026-11-30T11:00:00.000000Z"


def diagram_block(text: str) -> str:
    """The mermaid block that follows the status-transitions anchor."""
    found = re.search(r"```mermaid\n(.*?)```", text[text.index(ANCHOR) :], re.S)
    assert found is not None, "no mermaid block after the status-transitions anchor"
    return found.group(1)


def parse_edges(block: str) -> list[Edge]:
    drawn: list[Edge] = []
    for n, raw in enumerate(block.splitlines(), 1):
        line = raw.strip()
        if not line or HEADER.match(line):
            continue
        edge = EDGE.match(line)
        if edge is None:
            raise ValueError(f"diagram line {n} is neither an edge nor a header: {raw!r}")
        source, target, operation = edge.groups()
        drawn.append((source, target, operation))
    return drawn


def mismatch(drawn: Sequence[Edge], table: frozenset[Edge]) -> dict[str, list[Edge]]:
    """What only the diagram draws, what only the table allows, what is drawn twice."""
    found = {
        "only in the diagram": sorted(set(drawn) - table),
        "only in the table": sorted(table - set(drawn)),
        "drawn twice": sorted({e for e in drawn if drawn.count(e) > 1}),
    }
    return {what: listed for what, listed in found.items() if listed}


def the_diagram() -> list[Edge]:
    return parse_edges(diagram_block(DESIGN.read_text(encoding="utf-8")))


# --------------------------------------------------------------------------- diagram = table
def test_the_diagram_draws_exactly_the_table() -> None:
    assert mismatch(the_diagram(), edges()) == {}


def test_every_node_is_a_status_and_every_label_an_operation() -> None:
    names = {START, *(s.value for s in StepStatus)}
    for source, target, operation in the_diagram():
        assert source in names and target in names - {START}, (source, target)
        assert operation in TRANSITIONS, operation


def test_an_edge_only_in_the_diagram_fails() -> None:
    block = (
        diagram_block(DESIGN.read_text(encoding="utf-8")) + "    completed --> pending : claim\n"
    )
    assert mismatch(parse_edges(block), edges()) == {
        "only in the diagram": [("completed", "pending", "claim")]
    }


def test_an_edge_only_in_the_table_fails() -> None:
    table = dict(TRANSITIONS)
    invalidate = table["invalidate"]
    table["invalidate"] = Move(invalidate.sources | {StepStatus.RUNNING}, invalidate.targets)
    assert mismatch(the_diagram(), edges(table)) == {
        "only in the table": [("running", "stale", "invalidate")]
    }


def test_an_edge_drawn_twice_or_unreadable_fails() -> None:
    block = diagram_block(DESIGN.read_text(encoding="utf-8"))
    assert mismatch(parse_edges(block + "    [*] --> completed : adopt\n"), edges()) == {
        "drawn twice": [(START, "completed", "adopt")]
    }
    with pytest.raises(ValueError, match="neither an edge nor a header"):
        parse_edges(block + "    running -> failed : transition\n")


# --------------------------------------------------------------------------- table = store
def _set_up(store: LedgerStore, key: StepKey, status: StepStatus | None) -> None:
    """A row in ``status`` (owner ``owner``, started and last beating at T0), or none."""
    if status is None:
        return
    with store.engine.begin() as conn:
        conn.execute(
            sa.insert(step_run).values(
                id=f"id-{key.step_id}",
                project_id=key.project_id,
                episode_id=key.episode_id,
                step_id=key.step_id,
                status=status.value,
                run_id="owner",
                started_at=T0,
                heartbeat_at=T0,
                created_at=T0,
                updated_at=T0,
                recovery_count=0,
            )
        )


def _status(store: LedgerStore, key: StepKey) -> str | None:
    row = store.get(key)
    return None if row is None else str(row.status)


# One probe per status-guarded operation: did it move the row? ``transition`` is guarded by
# the owner, not the status (tests/ledger/test_ledger_store.py covers it).
PROBES: dict[str, Callable[[LedgerStore, StepKey], bool]] = {
    "claim": lambda store, key: store.claim(key, "taker", now=T1),
    "steal": lambda store, key: store.claim(
        key,
        "taker",
        allow_stale_steal=True,
        expected_started_at=T0,
        expected_run_id="owner",
        expected_heartbeat_at=T0,
        now=T1,
    ),
    "adopt": lambda store, key: store.adopt(key, "taker", summary="adopted", now=T1),
    "mark_not_applicable": lambda store, key: store.mark_not_applicable(
        key, "taker", "not here", now=T1
    ),
    "invalidate": lambda store, key: store.invalidate([key], "forced upstream", now=T1) == [key],
    "reset_running": lambda store, key: store.reset_running(key, T0, "stuck"),
}


def test_every_status_guarded_operation_is_probed() -> None:
    assert set(PROBES) == set(TRANSITIONS) - {"transition"}


@pytest.mark.parametrize("operation", sorted(PROBES))
def test_the_store_moves_exactly_what_the_table_allows(store: LedgerStore, operation: str) -> None:
    move = TRANSITIONS[operation]
    sources, targets = set(move.sources), set(move.targets)
    if operation == "steal":  # a steal is a claim too: it also takes what a claim takes
        sources |= TRANSITIONS["claim"].sources
        targets |= TRANSITIONS["claim"].targets
    wrong: list[str] = []
    for source in [None, *StepStatus]:
        key = StepKey("proj", "ep1", f"from_{source or 'no_row'}")
        _set_up(store, key, source)
        moved = PROBES[operation](store, key)
        after = _status(store, key)
        before = None if source is None else source.value
        if moved != (source in sources):
            wrong.append(f"{before} --{operation}--> {'moved' if moved else 'refused'}")
        elif moved and after not in {t.value for t in targets}:
            wrong.append(f"{before} --{operation}--> {after}, not one of the table's targets")
        elif not moved and after != before:
            wrong.append(f"{before} --{operation}--> refused, yet the row is now {after}")
    assert not wrong, wrong
