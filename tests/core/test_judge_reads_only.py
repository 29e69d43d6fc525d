"""The judge never writes: ``StepJudge`` reaches its stores through read calls only.

The import layers keep ``steps.judge`` from importing the runner or the lease; this keeps
the judge's own methods from calling a store's writing method (a claim, a publish, an
archive) directly, so what the sensor, ``status`` and ``decide`` run cannot write. mypy
proves the same from the types (the judge holds ``steps.readers`` protocols only, pinned by
``test_readers_by_type.py``); this scan keeps the list of calls it makes short.
"""

import ast
import inspect

from source_trees import parse_source

from pipeline_defs.steps import judge, runner

# Store methods a judge may call: reads, stat checks and path arithmetic. ``sync_inputs``
# is a read too: on object storage it copies the published inputs into this process's
# home (a cache, as ``load`` keeps a copy of what it fetched); it writes no ledger row, no
# published object, and nothing at all on a local home.
READS = frozenset(
    {
        "load",
        "path_for",
        "step_dir",
        "artifact_path",
        "artifact_problems",
        "refuse_links_in_tree",
        "sync_inputs",
        "with_companions",
        "not_regular",
        "archived_artifacts",
    }
)
STORES = frozenset({"ledger", "checkpoints"})


def _store_calls(source: str) -> set[str]:
    """``self.<store>.<method>`` calls in ``source``."""
    found = set()
    for node in ast.walk(parse_source(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        if (
            isinstance(owner, ast.Attribute)
            and owner.attr in STORES
            and isinstance(owner.value, ast.Name)
            and owner.value.id == "self"
        ):
            found.add(f"{owner.attr}.{node.func.attr}")
    return found


def test_the_judge_calls_only_reading_store_methods() -> None:
    calls = _store_calls(inspect.getsource(judge.StepJudge))
    assert calls, "the scan sees the judge's store calls"
    writes = {c for c in calls if c.split(".", 1)[1] not in READS}
    assert not writes, f"StepJudge writes through {sorted(writes)}"


def test_the_scan_would_see_a_write() -> None:
    # The runner is the writer: the same scan finds its writes (the check is not vacuous).
    writes = {
        c
        for c in _store_calls(inspect.getsource(runner.StepRunner))
        if c.split(".", 1)[1] not in READS
    }
    assert {"ledger.claim", "ledger.transition", "checkpoints.stage"} <= writes
