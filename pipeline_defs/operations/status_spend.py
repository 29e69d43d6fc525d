"""What ``storyboard status`` shows of the spend (docs/DESIGN.md#money-budgets): per episode
and per project, today (UTC) and in all, in calls and in money, beside the project's money
budgets where ``project.yaml`` sets them.

Read by the ledger (``resources/ledger/spend.py``): an episode's from its ``provider_call``
rows, filtered in SQL to the episodes shown; a project's from its ``project_day_spend`` rows
(one per day, kept by every call). Money is spent or reserved: a settled call's cost, else
(failed, outcome unknown, still in flight) the worst case reserved for it.
"""

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.project import load_project_config, money_budget, project_config_path
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.money import MoneyBudget, money_text
from pipeline_defs.resume.partition import Episode
from resources.ledger.spend import SpendTotal


@dataclass(frozen=True)
class SpendFigures:
    """One episode's or one project's spend, today (UTC) and in all, and its money budget
    (None: not set). ``cost_*`` are micro-units, ``*_text`` the amounts as shown."""

    calls_today: int = 0
    calls_total: int = 0
    cost_today_micros: int = 0
    cost_total_micros: int = 0
    priced_calls: int = 0
    budget_micros: int | None = None

    @classmethod
    def of(cls, total: SpendTotal | None, budget: int | None) -> "SpendFigures":
        if total is None:
            return cls(budget_micros=budget)
        return cls(
            total.calls_today,
            total.calls,
            total.micros_today,
            total.micros,
            total.priced,
            budget,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "cost_today": money_text(self.cost_today_micros),
            "cost_total": money_text(self.cost_total_micros),
            "budget": None if self.budget_micros is None else money_text(self.budget_micros),
        }


@dataclass(frozen=True)
class EpisodeSpend:
    partition: str
    figures: SpendFigures  # budget: the project's budget.max_cost_per_episode (in all)

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, **self.figures.as_dict()}


@dataclass(frozen=True)
class ProjectSpend:
    project: str
    figures: SpendFigures  # budget: budget.max_cost_per_project_per_day (today, UTC)

    def as_dict(self) -> dict[str, Any]:
        return {"project": self.project, **self.figures.as_dict()}


@dataclass(frozen=True)
class SpendReport:
    day: str  # today, UTC (YYYY-MM-DD)
    projects: tuple[ProjectSpend, ...]
    episodes: tuple[EpisodeSpend, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "day": self.day,
            "projects": [p.as_dict() for p in self.projects],
            "episodes": [e.as_dict() for e in self.episodes],
        }


def _budget(ws: Workspace, project_id: str) -> MoneyBudget | None:
    """The project's money budgets as its ``project.yaml`` sets them (None: a file that does
    not load; status says what it can without it)."""
    try:
        config = load_project_config(ws.home, project_id)
    except PipelineError:
        return None
    return money_budget(config, str(project_config_path(ws.home, project_id)))


def spend_report(
    ws: Workspace, episodes: Sequence[Episode], now: datetime, *, by_episode: bool = True
) -> SpendReport:
    """The spend of ``episodes`` and of their projects. ``by_episode``: the episodes' rows
    are read by (project, episode); else (very many episodes) by their projects."""
    day = now.date().isoformat()
    projects = sorted({e.project_id for e in episodes})
    pairs = [(e.project_id, e.episode_id) for e in episodes]
    spend = ws.ledger.spend
    if by_episode:
        per_episode = spend.episode_totals(day, pairs)
    else:
        per_episode = spend.episode_totals(day, project_ids=projects)
    episode_totals = {(t.project_id, t.episode_id): t for t in per_episode}
    project_totals = {t.project_id: t for t in spend.project_totals(day, projects)}
    budgets = {p: _budget(ws, p) for p in projects}

    def limit(project_id: str, per_day: bool) -> int | None:
        budget = budgets[project_id]
        if budget is None:
            return None
        return budget.per_project_day if per_day else budget.per_episode

    return SpendReport(
        day,
        tuple(
            ProjectSpend(p, SpendFigures.of(project_totals.get(p), limit(p, True)))
            for p in projects
        ),
        tuple(
            EpisodeSpend(
                e.partition_key,
                SpendFigures.of(
                    episode_totals.get((e.project_id, e.episode_id)), limit(e.project_id, False)
                ),
            )
            for e in episodes
        ),
    )
