"""The spend cap as an operator meets it (docs/DESIGN.md#spend-cap): ``storyboard
add-episode`` prints the story's estimated calls and refuses one over the cap; a capped
``materialize`` fails ``[budget.exhausted]``; ``decide`` and ``status`` show the step
blocked with the command that raises the cap; raised, a resume pays only what is missing.
The shipped storyboard, offline models, SQLite and PostgreSQL.
"""

from collections import Counter

from cli_helpers import CliEnv
from cli_homes import EPISODE, PARTITION, calls, decision_of, register, shipped

from pipeline_defs.storyboard import sample_stories

# The sample episode uncapped, default knobs (the demo's ep01): 24 calls.
FULL = Counter(
    {
        "entity_canon": 1,
        "entity_t2i": 1,
        "world_guide": 1,
        "scene_detail": 4,
        "shot_dependency_t2i": 1,
        "t2i_review": 1,
        "ref_image_gen": 4,
        "composite_image_gen": 3,
        "scene_image_pipeline": 8,
    }
)
RAISE_TO_40 = "storyboard settings set max_calls_per_episode 40"


def _add(cli: CliEnv, *extra: str) -> list[str]:
    story = str(sample_stories()[EPISODE.episode_id])
    return [
        "add-episode", "--project", EPISODE.project_id, "--episode", EPISODE.episode_id,
        "--story", story, *extra,
    ]  # fmt: skip


def test_add_episode_prints_the_estimate(cli_db: CliEnv) -> None:
    """Before: add-episode said nothing of what the story would cost."""
    cli = shipped(cli_db)
    out = cli.ok(*_add(cli)).output
    assert "estimated provider calls: 35 for 4 scenes (cap 200 per episode" in out
    payload = cli.json(*_add(cli))
    assert payload["estimated_calls"] == 35 and payload["max_calls_per_episode"] == 200
    assert payload["estimate"]["per_step"]["scene_image_pipeline"] == 8


def test_add_episode_refuses_a_story_estimated_over_the_cap(cli_db: CliEnv) -> None:
    """Before: a story of any length was registered (a 1 MB one started 5,880 calls)."""
    cli = shipped(cli_db)
    cli.ok("migrate")
    cli.ok("settings", "set", "max_calls_per_episode", "30")
    refused = cli.invoke(*_add(cli))
    assert refused.exit_code == 1
    error = refused.stderr
    assert "[budget.over_cap]" in error
    assert "estimated at 35 provider calls, over the episode's cap of 30" in error
    assert "storyboard settings set max_calls_per_episode 60" in error
    assert not (cli.home / "projects" / "demo" / "episodes" / "ep01" / "story.md").exists()
    # The project's own cap wins over the setting.
    project = cli.home / "projects" / "demo" / "project.yaml"
    project.parent.mkdir(parents=True, exist_ok=True)
    project.write_text("budget:\n  max_calls_per_episode: 35\n", encoding="utf-8")
    assert cli.json(*_add(cli))["max_calls_per_episode"] == 35


def _line_of(status: str, step: str) -> str:
    (line,) = [ln for ln in status.splitlines() if f" {step} " in ln]
    return line


def test_a_capped_episode_is_blocked_on_every_screen_and_a_raise_pays_only_the_rest(
    cli_db: CliEnv,
) -> None:
    """Capped at 20 of its 24 calls, the run stops before the 21st; decide and status
    show the step blocked with the raise command; raised, materialize pays 4 calls."""
    cli = shipped(cli_db)
    register(cli)
    cli.ok("migrate")
    cli.ok("settings", "set", "max_calls_per_episode", "20")
    capped = cli.invoke("materialize", "--partition", PARTITION)
    assert capped.exit_code != 0
    assert "[budget.exhausted]" in capped.output + capped.stderr
    spent = calls(cli)
    assert sum(spent.values()) == 20
    (step,) = [s for s in FULL if spent[s] < FULL[s]]  # the step that was stopped
    assert step == "scene_image_pipeline" and spent[step] == 4

    decided = decision_of(cli, step)
    assert decided["action"] == "block" and decided["code"] == "budget.exhausted"
    assert "recorded 20 provider calls, at its cap of 20" in decided["reason"]
    assert RAISE_TO_40 in decided["what_to_do"]
    text = cli.ok("decide", "--partition", PARTITION).output
    assert f"      {RAISE_TO_40}\n" in text

    status = cli.ok("status", "--partition", PARTITION).output
    assert " failed " in _line_of(status, step) and " blocked " in _line_of(status, step)
    assert "at its cap of 20" in status
    assert f"\n      {RAISE_TO_40}\n" in status  # the command on a line of its own
    flat = " ".join(status.split())  # the summary wraps at the terminal's width
    assert "blocked 1" in flat and "failed 1: budget.exhausted 1" in flat
    assert "max_calls_per_episode=20 (ledger)" in flat

    # A resume at the cap pays nothing.
    cli.invoke("materialize", "--partition", PARTITION)
    assert calls(cli) == spent

    cli.ok("settings", "set", "max_calls_per_episode", "40")
    cli.ok("materialize", "--partition", PARTITION)
    assert calls(cli) == FULL  # 4 more calls, all of them the capped step's missing ones
    assert decision_of(cli, step)["action"] == "skip"


def test_the_suggested_cap_covers_what_the_episode_needs(cli_db: CliEnv) -> None:
    """Registered at an estimate of 35, capped at 10 afterwards: the refusal suggests a cap
    of 35 (its estimate), which the resume then never hits; it completes at the clean
    run's 24 calls. Before: it suggested twice the cap, 20, and following it hit the cap
    again part way."""
    cli = shipped(cli_db)
    cli.ok("migrate")
    assert cli.json(*_add(cli))["estimated_calls"] == 35
    cli.ok("settings", "set", "max_calls_per_episode", "10")
    capped = cli.invoke("materialize", "--partition", PARTITION)
    assert capped.exit_code != 0
    assert sum(calls(cli).values()) == 10
    said = capped.output + capped.stderr
    assert "its story was estimated at 35 when registered" in said
    suggested = "storyboard settings set max_calls_per_episode 35"
    assert suggested in said
    stopped = [s for s in FULL if decision_of(cli, s)["action"] == "block"]
    assert stopped and all(suggested in decision_of(cli, s)["what_to_do"] for s in stopped)
    cli.ok(*suggested.removeprefix("storyboard ").split())
    cli.ok("materialize", "--partition", PARTITION)
    assert calls(cli) == FULL
