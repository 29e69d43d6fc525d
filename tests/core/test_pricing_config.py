"""Prices and money budgets in ``project.yaml`` (docs/DESIGN.md#money-budgets): an unpriced
model under a money budget is refused at load, naming it; prices give a call's worst case
and its cost."""

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from pipeline_defs.project import load_project_config, money_budget, parse_project_config
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.money import Usage, money_text, text_worst_case, to_micros

pytestmark = pytest.mark.unit

OPENAI: dict[str, Any] = {
    "provider": {
        "kind": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "text_model": "t-1",
        "image_model": "i-1",
    },
    "image": {"width": 512, "height": 512},
}
PRICED: dict[str, Any] = {
    **OPENAI,
    "pricing": {
        "t-1": {"input_per_1m": 0.15, "output_per_1m": 0.60, "cached_input_per_1m": 0.075},
        "i-1": {"per_image": {"512x512": 0.02}},
    },
    "budget": {"max_cost_per_episode": 2.50, "max_cost_per_project_per_day": 40},
}


def test_an_unpriced_model_under_a_money_budget_is_refused_at_load(tmp_path: Path) -> None:
    """Before: ``pricing:`` and the money budgets were unknown keys."""
    raw = {**PRICED, "pricing": {"t-1": PRICED["pricing"]["t-1"]}}  # the image model unpriced
    with pytest.raises(PipelineError) as refused:
        parse_project_config(raw, source="project.yaml")
    assert refused.value.code == ErrorCode.CONFIG_UNPRICED_MODEL
    assert refused.value.details["models"] == ["i-1"]
    assert "'i-1' (provider.image_model)" in refused.value.message
    assert "per_image.512x512" in refused.value.message
    # a price for another size is no price for the project's
    other_size = {**PRICED["pricing"], "i-1": {"per_image": {"1024x1024": 0.04}}}
    with pytest.raises(PipelineError):
        parse_project_config({**PRICED, "pricing": other_size}, source="project.yaml")
    # the same through the file the pipeline loads
    project = tmp_path / "projects" / "p1"
    project.mkdir(parents=True)
    (project / "project.yaml").write_text(
        "provider: {kind: openai, base_url: 'http://127.0.0.1:9/v1', text_model: t-1}\n"
        "budget: {max_cost_per_project_per_day: 40}\n"
    )
    with pytest.raises(PipelineError) as refused:
        load_project_config(tmp_path, "p1")
    assert refused.value.details["models"] == ["t-1"]  # the image model is the free offline one


def test_without_a_money_budget_nothing_needs_a_price() -> None:
    parse_project_config(OPENAI, source="project.yaml")
    # and the offline models are free: a money budget over them needs no pricing
    config = parse_project_config({"budget": {"max_cost_per_episode": 1}}, source="p")
    assert money_budget(config, "p").prices["offline-text-v1"].cost(Usage(10**6, 10**6)) == 0


def test_prices_give_the_worst_case_and_the_cost() -> None:
    budget = money_budget(parse_project_config(PRICED, source="p"), "p")
    assert (budget.per_episode, budget.per_project_day) == (2_500_000, 40_000_000)
    text = budget.prices["t-1"]
    # 1M input of which 400k cached, 100k output: 0.6*0.15 + 0.4*0.075 + 0.1*0.60
    assert text.cost(Usage(1_000_000, 100_000, 400_000)) == to_micros(Decimal("0.18"))
    assert budget.prices["i-1"].cost(Usage(images=1)) == 20_000
    worst = text_worst_case("ab", {"k": "é"}, 4096)
    assert worst.output_tokens == 4096 and worst.input_tokens >= len("ab") + len('{"k": "é"}')
    assert money_text(2_500_000) == "2.50" and money_text(1234) == "0.001234"
