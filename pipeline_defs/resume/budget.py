"""The spend cap of an episode (docs/DESIGN.md#spend-cap): how many provider calls it may
record, where that number comes from, and the words of a refusal.

Pure: the ledger counts and reserves the calls (``resources.ledger.audit_and_cost``), the
provider meter refuses a call past the cap before it is sent, and ``decide`` blocks a step
whose episode is at its cap (a fact it is given, :class:`Budget`).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.money import CALLS
from pipeline_defs.resume.settings_registry import SETTINGS

CODE_BUDGET_EXHAUSTED = ErrorCode.BUDGET_EXHAUSTED.value
SETTING = "max_calls_per_episode"
ENV_NAME = SETTINGS[SETTING].var
# The way out of a block, as its reason words it (``way_out_of`` finds it there again).
RAISE = "To go on, raise the cap: "
THEN_RESUME = "; then resume (what is already paid for is kept)"
# Where a cap came from besides the settings' own sources (default, ledger, env, resource).
SOURCE_PROJECT = "project"


@dataclass(frozen=True)
class CallCap:
    """The cap in force for one project's episodes, and where an operator raises it."""

    limit: int
    source: str = "default"  # project, env, resource, ledger or default
    project_file: str | None = None  # the project.yaml holding it (source project)
    # The calls the episode's story was estimated at when registered (None: unknown), asked
    # only when a refusal or a block is worded: never on the way of a call or a claim.
    estimate: Callable[[], int | None] | None = field(default=None, compare=False)

    def where(self) -> str:
        if self.source == SOURCE_PROJECT:
            return f"budget.{SETTING} in {self.project_file}"
        if self.source == "env":
            return f"{ENV_NAME} of the code location"
        if self.source == "resource":
            return f"{SETTING} on the code location's PipelineResource"
        if self.source == "ledger":
            return f"the ledger setting {SETTING}"
        return f"the default {SETTING}"

    def raise_command(self, to: int) -> str:
        """What an operator runs (or edits) to raise the cap to ``to``."""
        if self.source == SOURCE_PROJECT:
            return f"set budget.{SETTING}: {to} in {self.project_file}"
        if self.source in ("env", "resource"):
            return (
                f"set {ENV_NAME}={to} in the environment of the code location and its run "
                "workers, and restart them"
            )
        return f"storyboard settings set {SETTING} {to}"

    def suggestion(self, needed: int, estimated: int | None = None) -> int:
        """A raised cap to offer: twice the current one, or what is needed if more, and at
        least the episode's estimate (what a run of its story costs, so following the
        suggestion does not hit the cap again part way)."""
        return max(2 * self.limit, needed, estimated or 0)

    def way_out(self, spent: int, estimated: int | None = None) -> str:
        """What an operator does to go on: the command that raises the cap, then resume."""
        to = self.suggestion(spent + 1, estimated)
        return f"{RAISE}{self.raise_command(to)}{THEN_RESUME}"

    def exhausted(self, project_id: str, episode_id: str, spent: int) -> str:
        """Why a step of the episode is blocked, with the command that raises the cap."""
        estimated = None if self.estimate is None else self.estimate()
        said = (
            f" (its story was estimated at {estimated} when registered)"
            if estimated is not None
            else ""
        )
        return (
            f"episode {project_id}/{episode_id} has recorded {spent} provider calls, at its "
            f"cap of {self.limit} ({self.where()}){said}; no further call is sent. "
            f"{self.way_out(spent, estimated)}"
        )

    def refusal(self, project_id: str, episode_id: str, spent: int, *, step: str) -> PipelineError:
        """The meter's refusal of a call that would take the episode past the cap."""
        return PipelineError(
            ErrorCode.BUDGET_EXHAUSTED,
            f"{step}: a provider call was refused before it was sent: "
            + self.exhausted(project_id, episode_id, spent),
            details={"cap": self.limit, "spent": spent, "setting": SETTING, "budget": CALLS},
        )


def cap_in_force(
    settings_limit: int,
    settings_source: str,
    project_limit: int | None,
    project_file: str,
    estimate: Callable[[], int | None] | None = None,
) -> CallCap:
    """The project's own cap when its ``project.yaml`` sets one, else the settings'."""
    if project_limit is not None:
        return CallCap(project_limit, SOURCE_PROJECT, project_file, estimate)
    return CallCap(settings_limit, settings_source, estimate=estimate)


@dataclass(frozen=True)
class Budget:
    """The fact ``decide`` judges a claim against: the cap of the step's episode and its
    recorded calls, both asked only when the table reaches a claiming verdict (like
    ``verify``: a sensor tick judges every settled step and claims almost none)."""

    cap: Callable[[], CallCap]
    spent: Callable[[], int]
    project_id: str
    episode_id: str


def way_out_of(reason: str) -> str:
    """The way out a ``budget.exhausted`` block's reason names (status, the sensor's check)."""
    start = reason.find(RAISE)
    end = reason.find(THEN_RESUME, start)
    if start < 0 or end < 0:
        return f"raise the spend cap ({SETTING}), then resume"
    return reason[start + len("To go on, ") : end + len(THEN_RESUME)]
