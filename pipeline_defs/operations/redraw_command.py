"""``storyboard redraw``: chosen items of one image step drawn again (tag ``resume/redraw``)."""

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pipeline_defs.operations.graphql import submit_via_graphql
from pipeline_defs.operations.run_report import RunReport
from pipeline_defs.operations.runs import CLI_TAGS, run_assets
from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.partition import Episode
from pipeline_defs.steps.graph import downstream_of
from pipeline_defs.steps.redraw import dependents_of, make_redraw, resolve_targets


@dataclass
class RedrawPlan:
    """What a redraw launch asks for, and the pictures built from those items."""

    step: str
    items: list[str]
    with_dependents: bool
    selection: list[str]
    dependents: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_redraw(
    ws: Workspace, partition_key: str, step_id: str, items: Sequence[str], *, with_dependents: bool
) -> RedrawPlan:
    """Validate the request (typed errors before any launch) and choose the assets to run:
    the step, plus with dependents the redrawable steps downstream of it."""
    step = ws.step(step_id)
    episode = Episode.parse(partition_key)
    request = make_redraw(items, with_dependents=with_dependents)
    key = episode.step(step.step_id)

    def load(other: str) -> Any:
        return ws.checkpoints.load(episode.step(other))

    # The same resolution the run makes: an unknown item fails here, before a launch.
    targets = sorted(resolve_targets(step, key, request, load, ws.steps))
    selection = [step.step_id]
    if with_dependents:
        downstream = downstream_of(ws.steps, step.step_id)
        selection += [s for s in downstream if ws.step(s).redrawable]
    return RedrawPlan(
        step.step_id,
        targets,
        with_dependents,
        selection,
        dependents_of(ws.steps, load, step.step_id, targets),
    )


def redraw_step(
    ws: Workspace,
    partition_key: str,
    step_id: str,
    items: Sequence[str],
    *,
    with_dependents: bool = False,
    graphql_url: str | None = None,
    location: str | None = None,
    wait: bool = True,
    timeout_seconds: float = 3600,
) -> tuple[RedrawPlan, RunReport]:
    """Launch a redraw of ``items`` (tag ``resume/redraw``), in-process or via GraphQL."""
    plan = plan_redraw(ws, partition_key, step_id, items, with_dependents=with_dependents)
    request = make_redraw(items, with_dependents=with_dependents)
    tags = {**CLI_TAGS, **request.as_tags()}
    if graphql_url is None:
        return plan, run_assets(ws, partition_key, plan.selection, tags=tags)
    report = submit_via_graphql(
        ws,
        graphql_url,
        partition_key,
        plan.selection,
        tags=tags,
        location=location,
        wait=wait,
        timeout_seconds=timeout_seconds,
    )
    return plan, report
