"""``storyboard add-episode`` says what the story may cost in money next to its estimated
calls when the project prices its models (docs/DESIGN.md#money-budgets): at most, every
text call at its worst case and every picture at the image price; over
``budget.max_cost_per_episode`` it warns and registers the episode anyway.
"""

from pathlib import Path

from cli_helpers import CliEnv
from cli_homes import EPISODE, shipped

from pipeline_defs.storyboard import sample_stories

# The sample ep01 at default knobs: 35 calls, 9 of them text (entity_canon, world_guide,
# entity_t2i, shot_dependency_t2i, t2i_review, scene_detail x 4 scenes), 26 pictures.
TEXT_CALLS, IMAGE_CALLS = 9, 26
MAX_OUTPUT_TOKENS = 4096
PRICED = """\
provider:
  text_model: offline-text-v1
  image_model: offline-image-v1
pricing:
  offline-text-v1: {input_per_1m: 2.00, output_per_1m: 8.00}
  offline-image-v1: {per_image: {"*": 0.04}}
"""


def _add(cli: CliEnv, *extra: str) -> list[str]:
    story = str(sample_stories()[EPISODE.episode_id])
    return [
        "add-episode", "--project", EPISODE.project_id, "--episode", EPISODE.episode_id,
        "--story", story, *extra,
    ]  # fmt: skip


def _project(cli: CliEnv, text: str) -> None:
    path = cli.home / "projects" / EPISODE.project_id / "project.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _expected_micros() -> int:
    """Worked out here from the prices (per 1M tokens is micro-units per token): a text call
    at the story's bytes + 256 framing + 4096 of an earlier reply in, 4096 out."""
    story_bytes = len(Path(sample_stories()[EPISODE.episode_id]).read_bytes())
    text_call = (story_bytes + 256 + MAX_OUTPUT_TOKENS) * 2 + MAX_OUTPUT_TOKENS * 8
    return TEXT_CALLS * text_call + IMAGE_CALLS * 40_000


def test_add_episode_prints_the_most_the_story_may_cost(cli_db: CliEnv) -> None:
    """Before: add-episode gave calls only, whatever the prices."""
    cli = shipped(cli_db)
    _project(cli, PRICED)
    payload = cli.json(*_add(cli))
    cost = payload["estimated_cost"]
    assert (cost["text_calls"], cost["image_calls"]) == (TEXT_CALLS, IMAGE_CALLS)
    assert cost["total_micros"] == _expected_micros()
    assert payload["warnings"] == [] and payload["max_cost_per_episode"] is None
    out = cli.ok(*_add(cli)).output
    total = cost["total"]
    assert f"estimated cost: at most {total} ({TEXT_CALLS} text calls at their worst case, " in out
    assert "estimated provider calls: 35 for 4 scenes" in out


def test_an_estimate_over_the_money_budget_is_warned_not_refused(cli_db: CliEnv) -> None:
    cli = shipped(cli_db)
    _project(cli, PRICED + "budget:\n  max_cost_per_episode: 0.50\n")
    assert _expected_micros() > 500_000
    result = cli.invoke(*_add(cli))
    assert result.exit_code == 0, result.output
    assert "(budget 0.50 per episode)" in result.stdout
    assert "warning: the story's estimated calls may cost up to" in result.stderr
    assert "over the episode's money budget of 0.50 (budget.max_cost_per_episode in" in (
        result.stderr
    )
    assert "partition demo/ep01: added" in result.stdout  # registered anyway


def test_without_prices_no_cost_is_said(cli_db: CliEnv) -> None:
    cli = shipped(cli_db)
    payload = cli.json(*_add(cli))
    assert payload["estimated_cost"] is None and payload["warnings"] == []
    assert "estimated cost" not in cli.ok(*_add(cli)).output
