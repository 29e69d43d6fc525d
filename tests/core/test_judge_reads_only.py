"""The judge never writes: ``StepJudge`` reaches its stores through read calls only.

The import layers keep ``steps.judge`` from importing the runner or the lease; this keeps
the judge's own methods from calling a store's writing method (a claim, a publish, an
archive) directly, so what the sensor, ``status`` and ``decide`` run cannot write. mypy
proves the same from the types (the judge holds ``steps.readers`` protocols only, pinned by
``test_readers_by_type.py``); this scan keeps the list of calls it makes short.

Nor does the judge probe the filesystem itself: it lists and stats nothing, every probe is
a reader's method (``not_regular``, ``with_companions``, ``episode_input_files``,
``artifact_sha256``, …), so a
store over another publication answers them the same way.
"""

import ast
import inspect

from source_trees import parse_source

from pipeline_defs.steps import judge, runner
from resources.checkpoints import tree

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
        "episode_input_files",
        "artifact_sha256",
        "episode_estimate",  # the spend cap's suggestion covers it (a ledger read)
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


# Filesystem probes (listing, stat, existence, reading bytes): the checkpoint reader's
# business, never the judge's own call, whatever the receiver (a ``Path``, ``os``, a
# ``DirEntry``).
PROBES = frozenset(
    {
        "iterdir",
        "scandir",
        "listdir",
        "walk",
        "glob",
        "rglob",
        "stat",
        "lstat",
        "exists",
        "lexists",
        "is_file",
        "is_dir",
        "is_symlink",
        "open",
        "read_bytes",
        "read_text",
        "file_sha256",
    }
)


def _probes(source: str) -> set[str]:
    """The names of the filesystem probes ``source`` calls (``x.iterdir()``, ``lstat(p)``)."""
    found = set()
    for node in ast.walk(parse_source(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = (
            func.attr
            if isinstance(func, ast.Attribute)
            else func.id
            if isinstance(func, ast.Name)
            else None
        )
        if name in PROBES:
            found.add(name)
    return found


def test_the_judge_probes_no_file_itself() -> None:
    probes = _probes(inspect.getsource(judge))
    assert not probes, f"the judge probes the filesystem itself: {sorted(probes)}"


def test_the_probe_scan_would_see_a_listing() -> None:
    # The checkpoint tree is where the probes live: the same scan finds them there.
    assert {"iterdir", "is_file", "scandir", "lstat", "file_sha256"} <= _probes(
        inspect.getsource(tree.CheckpointTree)
    )
