"""The partitions an active backfill targets: the sensor launches nothing for them
(docs/DESIGN.md#sensor).

A backfill and the resume sensor both launch runs of the same steps. A backfill is submitted
(``REQUESTED``) some seconds before Dagster's backfill daemon launches its runs; a sensor tick in
between judged the new episodes as work and launched a run of its own per episode, and the
backfill's runs then waited for those in the queue and skipped every step: two runs per episode,
the backfill reported done long after the work. So the partitions a backfill in progress targets
(any of the sensor's assets) are a fact the tick receives, as the runs in flight are: their
launches are held, and the tick after the backfill ends (completed, failed, canceled) judges them
again and launches whatever the backfill left undone.

Only ``REQUESTED`` launches runs: a backfill being canceled or failing (``CANCELING``,
``FAILING``) launches no more, and the runs it launched hold their partitions as runs in flight.
One query per tick, made when the tick first asks (a tick with nothing to launch or hold asks
nothing), whatever the number of partitions.
"""

from collections.abc import Collection, Mapping
from enum import Enum

import dagster as dg

from pipeline_defs.judging.tick import Backfilling

REQUESTED = "REQUESTED"

# Dagster 1.13 exports no name for its backfill statuses (``BulkActionStatus`` lives in a private
# module): the member ``get_backfills(status=...)`` wants is taken from a backfill it returns, once
# per process.
_REQUESTED: list[Enum] = []


def _requested_status(instance: dg.DagsterInstance) -> Enum | None:
    """The ``REQUESTED`` member of the instance's backfill status; None when it holds no
    backfill at all (then none is in progress either)."""
    if not _REQUESTED:
        latest = instance.get_backfills(limit=1)
        if not latest:
            return None
        status: Enum = latest[0].status
        _REQUESTED.append(type(status)[REQUESTED])
    return _REQUESTED[0]


def targets_of(backfill: object, steps: Collection[dg.AssetKey]) -> set[str]:
    """The partitions of ``steps`` a backfill targets (an asset backfill's target subset; a job
    backfill's partition names when its asset selection holds one of ``steps``)."""
    data = getattr(backfill, "asset_backfill_data", None)
    if data is not None:
        found: set[str] = set()
        for key, subset in data.target_subset.partitions_subsets_by_asset_key.items():
            if key in steps:
                found.update(subset.get_partition_keys())
        return found
    selection = getattr(backfill, "asset_selection", None) or ()
    names = getattr(backfill, "partition_names", None) or ()
    return set(names) if any(key in steps for key in selection) else set()


def active_backfills(
    instance: dg.DagsterInstance, steps: Collection[dg.AssetKey]
) -> dict[str, str]:
    """Partition → the id of a backfill in progress (``REQUESTED``) that targets it for one of
    ``steps`` (the oldest, when several do). One query of the instance's backfills."""
    status = _requested_status(instance)
    if status is None:
        return {}
    held: dict[str, str] = {}
    # Newest first: the oldest backfill's id is the one kept.
    for backfill in instance.get_backfills(status=status):  # type: ignore[arg-type]  # the member, by its own type
        for pk in targets_of(backfill, steps):
            held[pk] = backfill.backfill_id
    return held


def backfills_in_progress(
    instance: dg.DagsterInstance, steps: Collection[dg.AssetKey]
) -> Backfilling:
    """The tick's fact: of some partitions, those an active backfill targets → its id. The
    instance is asked once, on the first question (the tick asks up to twice)."""
    known: list[dict[str, str]] = []

    def ask(partitions: Collection[str]) -> Mapping[str, str]:
        if not partitions:
            return {}
        if not known:
            known.append(active_backfills(instance, steps))
        return {pk: known[0][pk] for pk in partitions if pk in known[0]}

    return ask
