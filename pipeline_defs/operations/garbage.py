"""``storyboard gc``: delete attempt prefixes on object storage that nothing names.

The core is :func:`resources.storage_garbage.collect_unnamed`, shared with the ``storage_gc`` job
and its daily schedule (off by default); this is the command's view of it.
"""

from datetime import datetime, timedelta

from pipeline_defs.operations.workspace import Workspace
from resources.storage_garbage import DEFAULT_GRACE, GarbageReport, collect_unnamed

__all__ = ["DEFAULT_GRACE", "GarbageReport", "collect_garbage"]


def collect_garbage(
    ws: Workspace,
    *,
    grace: timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    now: datetime | None = None,
) -> GarbageReport:
    """Delete unnamed, old attempt prefixes of the configured object storage."""
    return collect_unnamed(ws.checkpoints, ws.ledger, grace=grace, dry_run=dry_run, now=now)
