"""Redraw chosen items of a step: the request, its targets, its dependents.

A launch tagged ``resume/redraw=<id>[,<id>…]`` (or ``all``) asks one step to draw exactly
those items again. Ids are the ones the step's checkpoint lists (``Step.redraw_items``);
anything else fails typed before the claim, so nothing is changed or paid for.

Items built from another step's item record it (``Step.item_sources``: the upstream step,
item and the sha256 it was built from). That gives the dependents of a redraw (reported in
the run's metadata) and the items built from a picture that has been redrawn since
(``outdated_items``, shown by ``storyboard decide``). With ``resume/redraw_dependents=true``
a downstream step in the same run redraws exactly its outdated items; without it they are
only reported, never redrawn silently.

Dagster-free: the asset factory reads the tags, the run protocol resolves the targets.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import Episode, StepKey, validate_id
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.steps.spec import Step
from resources.checkpoints.envelope import Checkpoint

REDRAW_TAG = "resume/redraw"
REDRAW_DEPENDENTS_TAG = "resume/redraw_dependents"
ALL_ITEMS = "all"
MAX_LISTED = 20

Loader = Callable[[str], Checkpoint | None]  # step id -> that step's checkpoint (one episode)


@dataclass(frozen=True)
class Redraw:
    """What a launch asked for: item ids (or every item), and whether dependents follow."""

    items: tuple[str, ...] = ()
    all_items: bool = False
    with_dependents: bool = False

    def as_tags(self) -> dict[str, str]:
        tags = {REDRAW_TAG: ALL_ITEMS if self.all_items else ",".join(self.items)}
        if self.with_dependents:
            tags[REDRAW_DEPENDENTS_TAG] = "true"
        return tags


def make_redraw(items: Iterable[str], *, with_dependents: bool = False) -> Redraw:
    """A validated request: ids as the checkpoint lists them, ``all`` alone, no duplicates."""
    wanted = [str(i).strip() for i in items]
    if not wanted or any(not i for i in wanted):
        raise PipelineError(
            ErrorCode.REDRAW_INVALID, f"redraw needs item ids or {ALL_ITEMS!r}, got {list(items)!r}"
        )
    if ALL_ITEMS in wanted:
        if len(wanted) > 1:
            raise PipelineError(
                ErrorCode.REDRAW_INVALID, f"redraw {ALL_ITEMS!r} cannot be combined with item ids"
            )
        return Redraw(all_items=True, with_dependents=with_dependents)
    for item in wanted:
        validate_id(item, "redraw item id")
    return Redraw(tuple(dict.fromkeys(wanted)), with_dependents=with_dependents)


def parse_redraw(tags: Mapping[str, str]) -> Redraw | None:
    """The redraw a run's tags ask for, None without ``resume/redraw``; bad tags fail typed."""
    if REDRAW_TAG not in tags:
        if REDRAW_DEPENDENTS_TAG in tags:
            raise PipelineError(
                ErrorCode.REDRAW_INVALID, f"tag {REDRAW_DEPENDENTS_TAG} needs tag {REDRAW_TAG}"
            )
        return None
    flag = tags.get(REDRAW_DEPENDENTS_TAG, "false").strip().lower()
    if flag not in ("true", "false"):
        raise PipelineError(
            ErrorCode.REDRAW_INVALID,
            f"tag {REDRAW_DEPENDENTS_TAG}={flag!r}: expected true or false",
        )
    return make_redraw(tags[REDRAW_TAG].split(","), with_dependents=flag == "true")


# --------------------------------------------------------------------------- dependents
def dependents_of(
    steps: Iterable[Step], load: Loader, step_id: str, items: Sequence[str]
) -> dict[str, list[str]]:
    """Items of downstream steps built (directly or not) from ``items`` of ``step_id``,
    as their checkpoints record it: step id -> item ids (steps without any left out)."""
    graph = StepGraph(steps)
    changed: set[tuple[str, str]] = {(step_id, i) for i in items}
    found: dict[str, list[str]] = {}
    for downstream in graph.downstream(step_id):
        step = graph.step(downstream)
        checkpoint = load(downstream)
        if checkpoint is None:
            continue
        hit = [
            item
            for item, sources in step.item_sources(checkpoint).items()
            if any((s.step_id, s.item_id) in changed for s in sources)
        ]
        if hit:
            found[downstream] = hit
            changed.update((downstream, i) for i in hit)
    return found


def outdated_of(step: Step, checkpoint: Checkpoint, load: Loader) -> dict[str, list[str]]:
    """Items of ``checkpoint`` built from an upstream item whose recorded sha256 is no longer
    the one the upstream checkpoint lists (it was redrawn since): item -> "step/item"."""
    upstream: dict[str, Mapping[str, str]] = {}
    found: dict[str, list[str]] = {}
    for item, sources in step.item_sources(checkpoint).items():
        for source in sources:
            if source.step_id not in upstream:
                found_cp = load(source.step_id)
                upstream[source.step_id] = _current_hashes(found_cp) if found_cp is not None else {}
            current = upstream[source.step_id].get(source.item_id)
            if current is not None and current != source.sha256:
                found.setdefault(item, []).append(f"{source.step_id}/{source.item_id}")
    return found


def _current_hashes(checkpoint: Checkpoint) -> dict[str, str]:
    images = checkpoint.data.get("images")
    if not isinstance(images, Mapping):
        return {}
    return {
        str(item): str(entry["sha256"])
        for item, entry in images.items()
        if isinstance(entry, Mapping) and isinstance(entry.get("sha256"), str)
    }


def outdated_items(
    steps: Iterable[Step], load: Callable[[StepKey], Checkpoint | None], episode: Episode
) -> dict[str, dict[str, list[str]]]:
    """Per step of one episode: its outdated items (see ``outdated_of``); empty steps left out.

    ``load`` may raise a typed error for a broken checkpoint: such a step is skipped here
    (the judge reports it), never guessed about.
    """

    def quiet(step_id: str) -> Checkpoint | None:
        try:
            return load(episode.step(step_id))
        except PipelineError:
            return None

    out: dict[str, dict[str, list[str]]] = {}
    for step in steps:
        checkpoint = quiet(step.step_id)
        if checkpoint is None or not step.redrawable:
            continue
        found = outdated_of(step, checkpoint, quiet)
        if found:
            out[step.step_id] = found
    return out


# --------------------------------------------------------------------------- targets
def _listed_upstream(step: Step, items: Sequence[str], load: Loader, steps: Iterable[Step]) -> bool:
    """Whether one redrawable step upstream of ``step`` lists every one of ``items``."""
    graph = StepGraph(steps)
    for other in graph.declared:
        if not other.redrawable or step.step_id not in graph.downstream(other.step_id):
            continue
        found = load(other.step_id)
        if found is not None and set(items) <= set(other.redraw_items(found)):
            return True
    return False


def resolve_targets(
    step: Step, key: StepKey, request: Redraw, load: Loader, steps: Iterable[Step]
) -> frozenset[str]:
    """The items this step must redraw for ``request``; typed failure when impossible.

    The step whose checkpoint lists every named id redraws them. With dependents asked
    for, a step downstream of the one listing them redraws its outdated items instead
    (maybe none: then it resumes as usual). Anything else is ``redraw.unknown_item``.
    """
    if not step.redrawable:
        raise PipelineError(
            ErrorCode.REDRAW_UNSUPPORTED,
            f"{key}: cannot redraw: {key.step_id} has no items to redraw",
        )
    checkpoint = load(key.step_id)
    if checkpoint is None:
        raise PipelineError(
            ErrorCode.REDRAW_UNKNOWN_ITEM,
            f"{key}: cannot redraw: {key.step_id} has no checkpoint yet (nothing drawn)",
        )
    listed = list(step.redraw_items(checkpoint))
    if request.all_items:
        return frozenset(listed)
    known = set(listed)
    unknown = [i for i in request.items if i not in known]
    if not unknown:
        return frozenset(request.items)
    if request.with_dependents and _listed_upstream(step, unknown, load, steps):
        return frozenset(outdated_of(step, checkpoint, load))
    shown = ", ".join(listed[:MAX_LISTED]) + (" …" if len(listed) > MAX_LISTED else "")
    raise PipelineError(
        ErrorCode.REDRAW_UNKNOWN_ITEM,
        f"{key}: {key.step_id} lists no item {', '.join(unknown)}; its items: {shown or 'none'}",
        details={"unknown": unknown},
    )
