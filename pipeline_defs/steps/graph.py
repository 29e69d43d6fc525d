"""The step graph: dependency order and upstream/downstream lookups, written once.

The asset factory, the run protocol (force invalidates downstream), redraw (dependents of
an item) and batch judgement (a step waits on its upstream) all ask the same questions of
the same declarations; they ask this one object.
"""

import functools
from collections.abc import Iterable

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.steps.spec import Step


class StepGraph:
    """Steps by id, in declaration order (a later step with the same id replaces one).

    Lookups are computed on first use and kept: the graph is immutable once built, and a
    sensor asks the same questions for every partition.
    """

    def __init__(self, steps: Iterable[Step]) -> None:
        self.catalog: dict[str, Step] = {s.step_id: s for s in steps}
        self._downstream: dict[str, tuple[str, ...]] = {}

    def __contains__(self, step_id: object) -> bool:
        return step_id in self.catalog

    def step(self, step_id: str) -> Step:
        return self.catalog[step_id]

    @property
    def declared(self) -> tuple[Step, ...]:
        return tuple(self.catalog.values())

    def unknown_deps(self) -> list[str]:
        """Dependencies no step of the graph declares (sorted)."""
        return sorted({d for s in self.catalog.values() for d in s.deps if d not in self.catalog})

    @functools.cached_property
    def ordered(self) -> tuple[Step, ...]:
        """Dependencies first, otherwise declaration order; refuses cycles (``input.invalid``).

        Dependencies outside the graph are ignored here (``unknown_deps`` names them).
        """
        catalog = self.catalog
        done: dict[str, Step] = {}

        def visit(step: Step, trail: tuple[str, ...]) -> None:
            if step.step_id in done:
                return
            if step.step_id in trail:
                raise PipelineError(
                    ErrorCode.INPUT_INVALID, f"step dependency cycle: {[*trail, step.step_id]}"
                )
            for dep in step.deps:
                if dep in catalog:
                    visit(catalog[dep], (*trail, step.step_id))
            done[step.step_id] = step

        for step in catalog.values():
            visit(step, ())
        return tuple(done.values())

    def downstream(self, step_id: str) -> tuple[str, ...]:
        """Every step that transitively depends on ``step_id``, in declaration order."""
        found = self._downstream.get(step_id)
        if found is None:
            steps = self.catalog.values()
            reached: set[str] = set()
            frontier = [step_id]
            while frontier:
                current = frontier.pop()
                for other in steps:
                    if current in other.deps and other.step_id not in reached:
                        reached.add(other.step_id)
                        frontier.append(other.step_id)
            found = self._downstream[step_id] = tuple(
                s.step_id for s in steps if s.step_id in reached
            )
        return found

    @functools.cached_property
    def _upstream(self) -> dict[str, tuple[str, ...]]:
        ordered = self.ordered
        position = {s.step_id: i for i, s in enumerate(ordered)}
        closure: dict[str, set[str]] = {}
        for step in ordered:
            found: set[str] = set()
            for dep in step.deps:
                if dep in position:
                    found.add(dep)
                    found |= closure[dep]
            closure[step.step_id] = found
        return {k: tuple(sorted(v, key=position.__getitem__)) for k, v in closure.items()}

    def upstream(self, step_id: str) -> tuple[str, ...]:
        """Every step ``step_id`` transitively depends on, in dependency order."""
        return self._upstream[step_id]

    def upstream_closure(self) -> dict[str, tuple[str, ...]]:
        """``upstream`` of every step (a copy)."""
        return dict(self._upstream)


def order_steps(steps: Iterable[Step]) -> tuple[Step, ...]:
    """Dependencies first, otherwise declaration order; refuses cycles."""
    return StepGraph(steps).ordered


def downstream_of(steps: Iterable[Step], step_id: str) -> tuple[str, ...]:
    """Every step that transitively depends on ``step_id``, in declaration order."""
    return StepGraph(steps).downstream(step_id)
