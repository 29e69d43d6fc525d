"""``storyboard force``: one step relaunched with ``resume/mode=force``."""

from collections.abc import Mapping

from pipeline_defs.operations.graphql import submit_via_graphql
from pipeline_defs.operations.run_report import RunReport
from pipeline_defs.operations.runs import CLI_TAGS, run_assets
from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.partition import Episode
from pipeline_defs.steps.graph import downstream_of
from pipeline_defs.wiring.assets import MODE_TAG
from resources.ledger.audit import AuditAction

FORCE_TAGS: Mapping[str, str] = {**CLI_TAGS, MODE_TAG: "force"}


def force_step(
    ws: Workspace,
    partition_key: str,
    step_id: str,
    *,
    graphql_url: str | None = None,
    location: str | None = None,
    wait: bool = True,
    timeout_seconds: float = 3600,
) -> RunReport:
    """Launch one asset partition with ``resume/mode=force`` (in-process or via GraphQL)."""
    step = ws.step(step_id)
    Episode.parse(partition_key)
    if graphql_url is None:
        return run_assets(ws, partition_key, [step.step_id], tags=FORCE_TAGS)
    return submit_via_graphql(
        ws,
        graphql_url,
        partition_key,
        [step.step_id],
        tags=FORCE_TAGS,
        location=location,
        wait=wait,
        timeout_seconds=timeout_seconds,
    )


def invalidated_by(ws: Workspace, run_id: str, partition_key: str, step_id: str) -> list[str]:
    """The downstream steps a force run invalidated, in the order it did.

    A force invalidates only the forced step's dependents in its own episode, and audits
    each as an ``invalidate`` transition under an owner token of its run (``<run id>:…``):
    only those steps' audit rows are read, not the whole table.
    """
    episode = Episode.parse(partition_key)
    owner = f"{run_id}:"
    found = [
        t
        for other in downstream_of(ws.steps, ws.step(step_id).step_id)
        for t in ws.ledger.transitions(episode.step(other))
        if t.action is AuditAction.INVALIDATE and str(t.run_id or "").startswith(owner)
    ]
    return [t.step_id for t in sorted(found, key=lambda t: t.transition_seq)]
