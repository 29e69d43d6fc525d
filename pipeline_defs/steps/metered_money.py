"""What the provider meter reserves for a call and what it settles it to
(docs/DESIGN.md#money-budgets): the price of the model asked, the call's worst case (a text
call sent with an output limit), and its cost from the usage its reply reports.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.money import MoneyBudget, Price, Reservation, Usage, text_worst_case
from resources.providers.base import IMAGE, TEXT, ImageCall, TextCall


@dataclass(frozen=True)
class PricedCall:
    """A call as it is sent, with its price (None: no money) and its reservation."""

    call: Any
    price: Price | None = None
    reservation: Reservation | None = None

    @property
    def reserved(self) -> int:
        return 0 if self.reservation is None else self.reservation.micros

    def cost(self, usage: Usage | None) -> int | None:
        """What the call cost by its reported usage; None (the reservation stands, the worst
        case) when it has no price or its endpoint reported no usage."""
        if self.price is None or usage is None:
            return None
        return self.price.cost(usage)


def price_call(
    money: MoneyBudget | None, kind: str, model: str | None, call: Any, *, step: str
) -> PricedCall:
    """The call priced for ``model``: under a money budget an unpriced model's call is
    refused before it is sent (``config.unpriced_model``); a text call is sent with the
    output limit its worst case assumes."""
    if money is None:
        return PricedCall(call)
    price = money.price(model)
    if price is None:
        if not money.limited:
            return PricedCall(call)
        raise PipelineError(
            ErrorCode.CONFIG_UNPRICED_MODEL,
            f"{step}: the {kind} model {model!r} has no price in {money.project_file} "
            "(pricing:) and a money budget is set; the call was not sent",
            details={"models": [model]},
        )
    worst = Usage()
    if kind == TEXT.name and isinstance(call, TextCall):
        limit = money.max_output_tokens
        worst = text_worst_case(call.prompt, call.payload, limit)
        if money.limited:
            call = dataclasses.replace(call, max_output_tokens=limit)
    elif kind == IMAGE.name and isinstance(call, ImageCall):
        worst = Usage(images=1)
    reservation = Reservation(
        price.cost(worst), money.per_episode, money.per_project_day, price.words()
    )
    return PricedCall(call, price, reservation)
