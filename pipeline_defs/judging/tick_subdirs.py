"""The artifact sub-directories a resume tick's scan stats. Dagster-free.

A step's artifact sub-directories (``frames/`` …) are known from the envelopes the judge
reads (``BatchJudge.artifact_dirs``) and from the cursor (``CursorState.subdirs``); the
scan stats each one, so that a picture deleted or added is a change of its partition.
Sub-directories first found while a tick judges join the tree identity after it
(:func:`settle_subdirs`).
"""

from collections.abc import Mapping

from pipeline_defs.judging.cursor import CursorState
from pipeline_defs.judging.memo import Memo
from pipeline_defs.judging.plan import TickPlan
from pipeline_defs.judging.scan import PartitionScan, Scan, episode_of, tree_digest
from pipeline_defs.resume.layout import DataLayout


def known_subdirs(state: CursorState | None, found: Mapping[str, set[str]]) -> dict[str, list[str]]:
    """Per step, the sub-directories the cursor names and those ``found`` in envelopes."""
    merged: dict[str, set[str]] = {}
    if state is not None:
        for step_id, known in state.subdirs.items():
            merged.setdefault(step_id, set()).update(known)
    for step_id, seen in found.items():
        merged.setdefault(step_id, set()).update(seen)
    return {k: sorted(v) for k, v in merged.items() if v}


def settle_subdirs(
    plan: TickPlan,
    memos: Mapping[str, Memo],
    step_ids: tuple[str, ...],
    found: Mapping[str, set[str]],
    layout: DataLayout,
) -> tuple[PartitionScan, str]:
    """Artifact sub-directories ``found`` in envelopes become part of the tree identity.

    Only the new ones are stat'ed (into ``memos`` too); everything else keeps the
    identity seen before judging, so a change made while the tick judged still shows
    up as a change next tick.
    """
    subdirs = plan.shape.subdirs
    merged = {
        k: sorted(set(subdirs.get(k, ())) | found.get(k, set())) for k in set(subdirs) | set(found)
    }
    merged = {k: v for k, v in merged.items() if v}
    if merged == {k: list(v) for k, v in subdirs.items()}:
        return plan.shape, plan.tree
    wider = PartitionScan(step_ids, merged)
    rescanned: dict[str, Scan] = {}
    for pk, scan in plan.scanned.items():
        episode = episode_of(pk)
        if episode is not None and scan.ints:
            base = layout.checkpoint_episode_dir(episode.project_id, episode.episode_id)
            scan = scan._replace(ints=plan.shape.widen(scan.ints, wider, base + "/"))
            if pk in memos:
                memos[pk].tree = scan.ints
        rescanned[pk] = scan
    return wider, tree_digest(plan.keys, rescanned)
