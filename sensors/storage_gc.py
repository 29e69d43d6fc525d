"""The ``storage_gc`` job and its daily schedule (off): garbage collection of the shared
store as Dagster runs it. What may be deleted, and the core ``storyboard gc`` shares, is
:mod:`resources.storage_garbage`.

The ``storage_gc_daily`` schedule runs the job once a day when turned on (it ships stopped:
deleting is for whoever owns the bucket to switch on, and the job needs ``DeleteObject``,
which workers should not have).
"""

from datetime import timedelta

import dagster as dg

from resources.checkpoints.published import scratch_cache_of
from resources.pipeline import PipelineResource
from resources.storage_garbage import DEFAULT_GRACE, collect_unnamed

GC_JOB = "storage_gc"
GC_SCHEDULE = "storage_gc_daily"


class GarbageConfig(dg.Config):
    """How the scheduled collection runs (the launchpad can change either)."""

    grace_hours: float = DEFAULT_GRACE.total_seconds() / 3600
    dry_run: bool = False


@dg.op(name="collect_storage_garbage")
def collect_storage_garbage(
    context: dg.OpExecutionContext, config: GarbageConfig, pipeline: PipelineResource
) -> None:
    """One collection; on a local home only the journal's (said, not failed)."""
    store = pipeline.checkpoints()
    if scratch_cache_of(store) is None:
        context.log.info("checkpoints are on a local home: only the journal is collected")
    report = collect_unnamed(
        store, pipeline.ledger(), grace=timedelta(hours=config.grace_hours), dry_run=config.dry_run
    )
    done, journal = report.collection, report.journal
    context.log.info(
        f"{'would delete' if report.dry_run else 'deleted'} {len(done.deleted_prefixes)} "
        f"attempt prefixes ({done.deleted_objects} objects) and {journal.deleted_entries} "
        f"journal entries of {report.storage}; kept {done.kept_referenced} named, "
        f"{done.kept_running} running, {done.kept_young} young attempts and "
        f"{journal.kept_in_use} entries in use, {journal.kept_young} young"
    )
    context.add_output_metadata(
        {
            "deleted_prefixes": len(done.deleted_prefixes),
            "deleted_objects": done.deleted_objects,
            "deleted_journal_entries": journal.deleted_entries,
        }
    )


@dg.job(
    name=GC_JOB,
    description=(
        "Deletes attempt prefixes on object storage that no ledger row names and no running "
        "step holds, once older than the grace period (storyboard gc, as a job)."
    ),
)
def storage_gc() -> None:
    collect_storage_garbage()


storage_gc_daily = dg.ScheduleDefinition(
    name=GC_SCHEDULE,
    job=storage_gc,
    cron_schedule="17 3 * * *",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="storage_gc once a day (off by default: turn it on where the bucket is yours).",
)
