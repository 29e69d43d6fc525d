"""Budgets in money (docs/DESIGN.md#money-budgets): the usage a reply reports, the price
of a model, a call's worst case and its real cost, and the words of a refusal.

Pure: the project file declares prices and budgets (``pipeline_defs/project.py``
``pricing:`` and ``budget:``), the provider meter reserves each call's worst case in the
ledger before it is sent and settles it to the reply's real usage after
(``resources.ledger.spend_statements``). Money is kept as integer micro-units (millionths
of the currency of the prices, whatever it is), never as floats.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from pipeline_defs.resume.errors import ErrorCode, PipelineError

MICROS = 1_000_000
# Which budget a ``budget.exhausted`` refusal names (``details["budget"]``).
CALLS = "calls"
EPISODE_MONEY = "episode money"
PROJECT_DAY_MONEY = "project-day money"
# Tokens a chat request spends beyond its prompt and payload: the system message, the
# roles and the framing of each message. Generous, so the worst case stays a worst case.
REQUEST_OVERHEAD_TOKENS = 256


@dataclass(frozen=True)
class Usage:
    """What one call used, as the endpoint reported it (a model that reports nothing: None
    in the reply). ``cached_input_tokens`` are part of ``input_tokens``."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    images: int = 0


def to_micros(amount: Decimal | int | float | str) -> int:
    """An amount of money in micro-units, rounded up (a cost never rounds to less)."""
    value = Decimal(str(amount)) * MICROS
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def money_text(micros: int | None) -> str:
    """Micro-units as an amount: ``2.5`` -> ``"2.50"``; sub-cent amounts keep their digits."""
    if micros is None:
        return "-"
    value = Decimal(micros) / MICROS
    text = f"{value:.2f}"
    if Decimal(text) != value:
        text = f"{value:.6f}".rstrip("0")
    return text


@dataclass(frozen=True)
class Price:
    """What one model charges, per 1M tokens (text) or per image of the project's size."""

    model: str
    input_per_1m: Decimal = Decimal(0)
    output_per_1m: Decimal = Decimal(0)
    cached_input_per_1m: Decimal | None = None  # None: cached input at the input price
    per_image: Decimal = Decimal(0)

    def cost(self, usage: Usage) -> int:
        """The micro-units ``usage`` costs at this price, rounded up."""
        cached = min(usage.cached_input_tokens, usage.input_tokens)
        cached_price = (
            self.input_per_1m if self.cached_input_per_1m is None else (self.cached_input_per_1m)
        )
        # per 1M tokens, in micro-units per token: the price itself
        total = (
            (usage.input_tokens - cached) * self.input_per_1m
            + cached * cached_price
            + usage.output_tokens * self.output_per_1m
            + usage.images * self.per_image * MICROS
        )
        return int(Decimal(total).to_integral_value(rounding=ROUND_CEILING))

    def words(self) -> str:
        """The price applied, as ``provider_call.price`` records it."""
        parts = {
            "model": self.model,
            "input_per_1m": str(self.input_per_1m),
            "output_per_1m": str(self.output_per_1m),
            "per_image": str(self.per_image),
        }
        if self.cached_input_per_1m is not None:
            parts["cached_input_per_1m"] = str(self.cached_input_per_1m)
        return json.dumps(parts, sort_keys=True)


def text_worst_case(prompt: str, payload: Mapping[str, Any], max_output_tokens: int) -> Usage:
    """The most a text call can use: every byte of its request a token (no tokenizer makes
    fewer bytes than tokens), plus the framing, and ``max_output_tokens`` out (the limit
    the request is sent with)."""
    request = prompt.encode("utf-8") + json.dumps(dict(payload), default=str).encode("utf-8")
    return Usage(
        input_tokens=len(request) + REQUEST_OVERHEAD_TOKENS, output_tokens=max_output_tokens
    )


@dataclass(frozen=True)
class MoneyBudget:
    """The money budgets of one project (None: that budget is not set) and where they are
    set, with its prices by model name."""

    per_episode: int | None  # micro-units
    per_project_day: int | None  # micro-units
    prices: Mapping[str, Price]
    max_output_tokens: int
    project_file: str = "project.yaml"

    @property
    def limited(self) -> bool:
        return self.per_episode is not None or self.per_project_day is not None

    def price(self, model: str | None) -> Price | None:
        return None if model is None else self.prices.get(model)

    def where(self, budget: str) -> str:
        key = "max_cost_per_episode" if budget == EPISODE_MONEY else "max_cost_per_project_per_day"
        return f"budget.{key} in {self.project_file}"

    def refusal(self, step: str, details: Mapping[str, Any]) -> PipelineError:
        """The meter's refusal of a call whose worst case does not fit a money budget."""
        budget = str(details.get("budget"))
        spent, limit = int(details.get("spent", 0)), int(details.get("limit", 0))
        reserve = int(details.get("reserve", 0))
        whose = "the project today (UTC)" if budget == PROJECT_DAY_MONEY else "the episode"
        return PipelineError(
            ErrorCode.BUDGET_EXHAUSTED,
            f"{step}: a provider call was refused before it was sent: the {budget} budget: "
            f"{whose} has spent or reserved {money_text(spent)} of {money_text(limit)} "
            f"({self.where(budget)}) and this call may cost up to {money_text(reserve)}; "
            f"no further call is sent. To go on, raise {self.where(budget)}"
            + ("" if budget == EPISODE_MONEY else " or wait for the next day (UTC)")
            + "; then resume (what is already paid for is kept)",
            details={
                "budget": budget,
                "spent": money_text(spent),
                "limit": money_text(limit),
                "reserve": money_text(reserve),
            },
        )


@dataclass(frozen=True)
class Reservation:
    """What the ledger reserves for one call before it is sent, against which limits."""

    micros: int
    per_episode: int | None = None
    per_project_day: int | None = None
    price: str | None = None  # the price applied (``Price.words``)

    @property
    def touches_money(self) -> bool:
        return self.micros > 0 or self.per_episode is not None or self.per_project_day is not None
