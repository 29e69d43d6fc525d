"""The spend cap on the ten storyboard steps (docs/DESIGN.md#spend-cap), real Dagster runs
on SQLite and PostgreSQL, the offline models counting what is really sent.

The sample episode costs 23 calls with the test knobs. Capped at 20, the run stops at the
21st call before sending it: the step fails ``[budget.exhausted]`` naming the cap, the
spend and the command that raises it; a resume at the cap sends nothing; raised, a resume
pays the 3 missing calls and nothing else.
"""

from collections import Counter
from collections.abc import Iterator

import dagster as dg
import pytest
from storyboard_support import (
    EPISODE,
    STEP_IDS,
    TEST_CONFIG,
    Env,
    create_pg_database,
    edit_config,
    scratch_dir,
    step_failure_messages,
    write_episode,
)

from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.errors import ErrorCode
from resources.providers import (
    ImageCall,
    ImageReply,
    OfflineImageModel,
    OfflineTextModel,
    TextCall,
    TextReply,
)

# What the offline models were asked, whatever the ledger says.
SENT: Counter[str] = Counter()
# The uncapped run of the sample episode with the test knobs, per step.
FULL = {
    "entity_canon": 1,
    "entity_t2i": 1,
    "world_guide": 1,
    "scene_detail": 4,
    "shot_dependency_t2i": 1,
    "t2i_review": 1,
    "ref_image_gen": 3,
    "composite_image_gen": 3,
    "scene_image_pipeline": 8,
}


class CountedText(OfflineTextModel):
    def complete(self, call: TextCall) -> TextReply:
        SENT["text"] += 1
        return super().complete(call)


class CountedImages(OfflineImageModel):
    def generate(self, call: ImageCall) -> ImageReply:
        SENT["image"] += 1
        return super().generate(call)


@pytest.fixture(params=["sqlite", "postgresql"])
def env(request: pytest.FixtureRequest) -> Iterator[Env]:
    if request.param == "sqlite":
        made = Env.sqlite(scratch_dir("cap"))
    else:
        server = request.getfixturevalue("pg_server_url")
        made = Env(scratch_dir("cap-pg"), create_pg_database(server), server)
    SENT.clear()
    try:
        yield made
    finally:
        made.destroy()


def _run(env: Env) -> tuple[dg.ExecuteInProcessResult, dict[str, int], int]:
    """A real Dagster run of every step: (result, recorded calls per step, calls sent)."""
    SENT.clear()
    outcome = env.materialize(
        text_model=CountedText(), image_model=CountedImages(), raise_on_error=False
    )
    recorded = {step: outcome.calls_of(step) for step in STEP_IDS if outcome.calls_of(step)}
    return outcome.result, recorded, sum(SENT.values())


def test_the_cap_refuses_before_sending_and_a_raised_cap_pays_only_what_is_missing(
    env: Env,
) -> None:
    """Before: no cap existed; the capped run made all 23 calls and succeeded."""
    project_file = (
        write_episode(
            env.home, config={**TEST_CONFIG, "budget": {"max_calls_per_episode": 20}}
        ).parents[2]
        / "project.yaml"
    )

    result, first, sent = _run(env)
    assert not result.success
    assert sum(first.values()) == 20 and sent == 20  # the 21st call was never sent
    assert env.ledger.episode_calls("demo", "ep01") == 20
    failures = step_failure_messages(result)
    assert list(failures) == ["scene_image_pipeline"]
    message = failures["scene_image_pipeline"]
    assert "[budget.exhausted]" in message
    assert "recorded 20 provider calls, at its cap of 20" in message
    assert f"budget.max_calls_per_episode in {project_file}" in message
    assert f"set budget.max_calls_per_episode: 40 in {project_file}" in message
    assert first["scene_image_pipeline"] == 5  # 5 of its 8 pictures drawn, then refused
    row = env.row("scene_image_pipeline")
    assert row is not None and row.status == "failed"

    # The judge blocks it (decide, status and the sensor read this verdict).
    decision = env.judge("scene_image_pipeline")
    assert decision.action is ResumeAction.BLOCK
    assert decision.code == ErrorCode.BUDGET_EXHAUSTED
    assert f"set budget.max_calls_per_episode: 40 in {project_file}" in decision.reason
    assert env.judge("story_source").action is ResumeAction.SKIP  # a clean step is no claim

    # A resume at the cap sends nothing and records nothing.
    result, again, sent = _run(env)
    assert not result.success
    assert again == {} and sent == 0
    assert "[budget.exhausted]" in step_failure_messages(result)["scene_image_pipeline"]

    # Raised: the resume pays the 3 missing pictures, nothing drawn before is paid again.
    edit_config(env.home, "budget.max_calls_per_episode", 40)
    result, resumed, sent = _run(env)
    assert result.success
    assert resumed == {"scene_image_pipeline": 3} and sent == 3
    total = Counter(c["step_id"] for c in env.ledger.provider_calls(episode=EPISODE))
    assert dict(total) == FULL
    assert env.row_of("scene_image_pipeline").status == "completed"


def test_a_force_at_the_cap_is_blocked_before_it_cleans_anything(env: Env) -> None:
    """A force pays too: at the cap it is blocked before its cleanup, and the pictures and
    rows below it stay as they were (a force claimed, archived, then failed at its first
    call before)."""
    write_episode(env.home)
    result, first, _sent = _run(env)
    assert result.success and sum(first.values()) == 23
    edit_config(env.home, "budget.max_calls_per_episode", 23)
    before = env.snapshot()
    SENT.clear()
    forced = env.materialize(
        ["ref_image_gen"],
        tags={"resume/mode": "force"},
        image_model=CountedImages(),
        raise_on_error=False,
    )
    assert not forced.result.success and forced.total_calls == 0 and sum(SENT.values()) == 0
    assert "[budget.exhausted]" in step_failure_messages(forced.result)["ref_image_gen"]
    assert env.snapshot() == before
    assert {s: str(r.status) for s, r in env.rows().items()} == dict.fromkeys(
        [*STEP_IDS], "completed"
    )
