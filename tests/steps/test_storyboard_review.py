"""t2i_review (docs/DESIGN.md#review): item ids under fan-out, sentinel refresh, victim writes."""

import copy
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, ClassVar

import pytest
from storyboard_support import PRE_REVIEW, Env, cloned, scratch_dir, write_episode

from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.storyboard import t2i_review
from pipeline_defs.storyboard.t2i_review import (
    Fix,
    apply_fixes,
    parse_fixes,
    refresh_prompt_hashes,
    scene_item_map,
)
from resources.checkpoints.envelope import sha256_text
from resources.providers import OfflineTextModel, TextCall, TextReply

VICTIMS = ("scene_detail", "entity_t2i")


@pytest.fixture(scope="module")
def pre_review() -> Iterator[Env]:
    env = Env.sqlite(scratch_dir("review"))
    write_episode(env.home)
    env.run_direct(PRE_REVIEW)
    yield env
    env.destroy()


@pytest.fixture
def env(pre_review: Env) -> Iterator[Env]:
    with cloned(pre_review) as copy_:
        yield copy_


def scenes_of(env: Env) -> list[dict[str, Any]]:
    checkpoint = env.checkpoint("scene_detail")
    assert checkpoint is not None
    return copy.deepcopy(list(checkpoint.data["scenes"]))


def fan_out_pair(scenes: list[dict[str, Any]]) -> tuple[int, int]:
    """Two list indices sharing one scene_index (the sample fans every scene out)."""
    for first, entry in enumerate(scenes):
        for second in range(first + 1, len(scenes)):
            if scenes[second]["scene_index"] == entry["scene_index"]:
                return first, second
    raise AssertionError("no fan-out in the sample data")


def victim_bytes(env: Env) -> dict[str, bytes]:
    return {v: env.checkpoint_path(v).read_bytes() for v in VICTIMS}


# ----------------------------------------------------------------------------- pure helpers
def test_item_ids_stay_unique_when_a_scene_fans_out(pre_review: Env) -> None:
    scenes = scenes_of(pre_review)
    first, second = fan_out_pair(scenes)
    item_map = scene_item_map(scenes)
    variations = sum(len(e["t2i_variations"]) for e in scenes)

    assert len(item_map) == variations
    scene = scenes[first]["scene_index"]
    assert item_map[f"S{scene}_L{first}_V0"] == (first, 0)
    assert item_map[f"S{scene}_L{second}_V0"] == (second, 0)


def test_fix_lands_on_the_addressed_entry_only(pre_review: Env) -> None:
    """Regression: addressing by scene_index once edited the first entry of the scene."""
    scenes = scenes_of(pre_review)
    first, second = fan_out_pair(scenes)
    before = copy.deepcopy(scenes)
    scene = scenes[second]["scene_index"]
    fix = Fix(f"S{scene}_L{second}_V0", "a corrected prompt, ink storyboard", "test")

    count, applied = apply_fixes(scenes, [fix], scene_item_map(scenes))

    assert (count, applied) == (1, [(second, 0)])
    assert scenes[first] == before[first]
    assert scenes[second]["t2i_variations"][0]["t2i_prompt"] == fix.t2i_prompt
    untouched = [i for i in range(len(scenes)) if i != second]
    assert [scenes[i] for i in untouched] == [before[i] for i in untouched]


def test_fix_equal_to_the_current_prompt_is_not_applied(pre_review: Env) -> None:
    scenes = scenes_of(pre_review)
    current = scenes[0]["t2i_variations"][0]["t2i_prompt"]
    item = f"S{scenes[0]['scene_index']}_L0_V0"
    assert apply_fixes(scenes, [Fix(item, current, "")], scene_item_map(scenes)) == (0, [])


def test_unknown_item_id_is_a_typed_error(pre_review: Env) -> None:
    scenes = scenes_of(pre_review)
    item_map = scene_item_map(scenes)
    reply = {"fixes": [{"item_id": "S1_L7_V0", "t2i_prompt": "x"}]}  # S1 is not at L7
    with pytest.raises(PipelineError) as info:
        parse_fixes(reply, set(item_map))
    assert info.value.code == "t2i_review.unknown_item_id"
    with pytest.raises(PipelineError) as info:
        apply_fixes(scenes, [Fix("S9_L0_V0", "x", "")], item_map)
    assert info.value.code == "t2i_review.unknown_item_id"


def test_refresh_touches_only_t2i_prompt_hash(pre_review: Env) -> None:
    scenes = scenes_of(pre_review)
    # Unrelated drift already present must survive the refresh (never laundered away).
    scenes[1]["t2i_variations"][0]["owned_validation"]["owned_hash"] = "0" * 64
    scenes[1]["camera_direction"] = "dutch angle"
    before = copy.deepcopy(scenes)
    item = f"S{scenes[1]['scene_index']}_L1_V0"
    _, applied = apply_fixes(scenes, [Fix(item, "new words", "")], scene_item_map(scenes))

    refresh_prompt_hashes(scenes, applied)

    new, old = scenes[1]["t2i_variations"][0], before[1]["t2i_variations"][0]
    assert new["owned_validation"]["t2i_prompt_hash"] == sha256_text("new words")
    for field in ("owned_hash", "camera_direction_hash", "validator"):
        assert new["owned_validation"][field] == old["owned_validation"][field]
    assert new["owned_validation"]["owned_hash"] == "0" * 64
    assert new["render_prompt_card"] == old["render_prompt_card"]
    assert new["render_prompt_card_hash"] == old["render_prompt_card_hash"]


def _drop_sentinel(scenes: list[dict[str, Any]]) -> None:
    del scenes[0]["t2i_variations"][0]["owned_validation"]


def _drop_validator(scenes: list[dict[str, Any]]) -> None:
    del scenes[0]["t2i_variations"][0]["owned_validation"]["validator"]


@pytest.mark.parametrize(
    ("damage", "applied"),
    [
        (_drop_sentinel, [(0, 0)]),
        (_drop_validator, [(0, 0)]),
        (None, [(99, 0)]),
        (None, [(0, 5)]),
        (None, [(-1, 0)]),
    ],
    ids=["missing-sentinel", "malformed-sentinel", "bad-list-index", "bad-variation", "negative"],
)
def test_refresh_failure_is_typed(pre_review: Env, damage: Any, applied: Any) -> None:
    scenes = scenes_of(pre_review)
    if damage:
        damage(scenes)
    with pytest.raises(PipelineError) as info:
        refresh_prompt_hashes(scenes, applied)
    assert info.value.code == "t2i_review.sentinel_refresh_failed"


# ----------------------------------------------------------------------------- the mutator
def test_review_fixes_victims_in_place_and_scene_detail_verifies_clean(env: Env) -> None:
    before = scenes_of(env)
    rows_before = env.rows()

    outcome = env.run_direct(["t2i_review"])["t2i_review"]

    assert outcome.status == "completed"
    assert outcome.mutated == VICTIMS
    review = env.checkpoint_of("t2i_review").data
    changed = review["applied"]["scene_detail"]
    assert changed and review["applied"]["entity_t2i"]
    after = scenes_of(env)
    item_map = scene_item_map(after)
    for item, (lst, v) in item_map.items():
        new, old = after[lst]["t2i_variations"][v], before[lst]["t2i_variations"][v]
        if item in changed:
            assert new["t2i_prompt"] != old["t2i_prompt"]
            assert "ink storyboard" in new["t2i_prompt"]
            assert new["render_prompt_card_hash"] == old["render_prompt_card_hash"]
        else:
            assert new == old, item  # a fan-out sibling keeps every byte
    # The victim verifies clean (sentinels refreshed) and stays SKIP for the judge.
    runtime = env.step_judge("scene_detail")
    scene_detail = env.checkpoint("scene_detail")
    assert scene_detail is not None
    report = runtime.verify(runtime.context(env.key("scene_detail")), scene_detail)
    assert report.is_complete
    for victim in VICTIMS:
        assert env.judge(victim).action is ResumeAction.SKIP
        mutations = env.checkpoint_of(victim).mutations
        assert len(mutations) == 1 and mutations[0]["by_step"] == "t2i_review"
        row, then = env.row(victim), rows_before[victim]
        assert row is not None
        # Never staled; the only change to the row is its seal, which names the edit.
        assert replace(row, checkpoint_seal=None) == replace(then, checkpoint_seal=None)
        sealed = env.checkpoints.sealed(env.key(victim), row.checkpoint_seal)
        assert sealed is not None
        assert sealed.version == env.checkpoint_of(victim).version
        assert list((env.step_dir(victim) / "archive").glob("*.json"))  # archived first
    scene_fields = env.checkpoint_of("scene_detail").mutations[0]["fields"]
    assert set(scene_fields) == {
        f"{item}.{field}"
        for item in changed
        for field in ("t2i_prompt", "owned_validation.t2i_prompt_hash")
    }
    mutated = [t for t in env.ledger.transitions() if t.action == "mutated"]
    assert sorted(t.step_id for t in mutated) == sorted(VICTIMS)
    # The mutator's own row is re-sealed over its victims' edited files (not left unsealed,
    # which would send every later sensor tick the long way for it), and the seal holds.
    review_row = env.row("t2i_review")
    assert review_row is not None and review_row.checkpoint_seal is not None
    assert env.checkpoints.sealed(env.key("t2i_review"), review_row.checkpoint_seal) is not None


def test_zero_fixes_writes_nothing(env: Env) -> None:
    env.run_direct(["t2i_review"])
    before = victim_bytes(env)
    mutated_before = [t for t in env.ledger.transitions() if t.action == "mutated"]
    env.checkpoint_path("t2i_review").unlink()  # completed row, no checkpoint: RERUN_SELF

    outcome = env.run_direct(["t2i_review"])["t2i_review"]

    assert outcome.decision.action is ResumeAction.RERUN_SELF
    assert outcome.mutated == ()
    review = env.checkpoint_of("t2i_review").data
    assert review["fixes"] == [] and review["reviewed"] > 0
    assert victim_bytes(env) == before
    assert [t for t in env.ledger.transitions() if t.action == "mutated"] == mutated_before


def test_forced_bad_refresh_fails_the_mutator_and_leaves_victims_identical(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = t2i_review.apply_fixes

    def off_by_one(*args: Any) -> tuple[int, list[tuple[int, int]]]:
        count, applied = real(*args)
        return count, [(lst + 100, v) for lst, v in applied]

    monkeypatch.setattr(t2i_review, "apply_fixes", off_by_one)
    before = victim_bytes(env)

    with pytest.raises(PipelineError) as info:
        env.run_direct(["t2i_review"])

    assert info.value.code == "t2i_review.sentinel_refresh_failed"
    assert victim_bytes(env) == before
    assert env.checkpoint("t2i_review") is None
    row = env.row("t2i_review")
    assert row is not None and row.status == "failed"
    assert "sentinel_refresh_failed" in (row.error_message or "")


def test_card_hash_change_during_review_is_refused(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = t2i_review.apply_fixes

    def meddling(scenes: Any, *args: Any) -> tuple[int, list[tuple[int, int]]]:
        result = real(scenes, *args)
        scenes[0]["t2i_variations"][0]["render_prompt_card_hash"] = "0" * 64
        return result

    monkeypatch.setattr(t2i_review, "apply_fixes", meddling)
    before = victim_bytes(env)

    with pytest.raises(PipelineError) as info:
        env.run_direct(["t2i_review"])

    assert info.value.code == "t2i_review.card_hash_unexpected_change"
    assert victim_bytes(env) == before


class EchoCheckingReviewer(OfflineTextModel):
    """The offline reviewer, plus one fix for an item id it was never given."""

    prompts: ClassVar[list[str]] = []

    def complete(self, call: TextCall) -> TextReply:
        reply = super().complete(call)
        if call.task != "t2i_review":
            return reply
        EchoCheckingReviewer.prompts.append(call.prompt)
        bogus = {"item_id": "S1_L99_V0", "t2i_prompt": "x", "reason": "hallucinated"}
        return TextReply({**reply.data, "fixes": [*reply.data["fixes"], bogus]}, 1, reply.model)


def test_reviewer_gets_every_item_id_and_an_unknown_echo_fails(env: Env) -> None:
    before = victim_bytes(env)
    EchoCheckingReviewer.prompts.clear()

    with pytest.raises(PipelineError) as info:
        env.run_direct(["t2i_review"], text_model=EchoCheckingReviewer())

    assert info.value.code == "t2i_review.unknown_item_id"
    assert "S1_L99_V0" in info.value.message
    (prompt,) = EchoCheckingReviewer.prompts
    for item in scene_item_map(scenes_of(env)):
        assert item in prompt
    assert "E_C01_O00" in prompt
    assert victim_bytes(env) == before


class ClaimingReviewer(OfflineTextModel):
    """The offline reviewer; while the review waits for it, another run claims a victim.

    A victim claimed before the review starts stops it at the gate (``step.gate_blocked``,
    both victims are its inputs), so the refusal under the victim's row lock is reached only
    by a claim made after the gate: here, during the review's model call.
    """

    claim: ClassVar[list[Any]] = []  # what to do when the review calls (set by the test)

    def complete(self, call: TextCall) -> TextReply:
        if call.task == "t2i_review":
            for act in ClaimingReviewer.claim:
                act()
        return super().complete(call)


def test_victim_running_refuses_the_edit(env: Env) -> None:
    """A victim another run claims after the review passed its gate: the mutator is refused
    the edit under the victim's row lock, and neither victim changes."""
    ledger = env.ledger
    claimed: list[bool] = []
    ClaimingReviewer.claim = [
        lambda: claimed.append(ledger.claim(env.key("scene_detail"), "rival:0"))
    ]
    before = victim_bytes(env)
    rows_before = env.rows()

    try:
        with pytest.raises(PipelineError) as info:
            env.run_direct(["t2i_review"], text_model=ClaimingReviewer())
    finally:
        ClaimingReviewer.claim = []

    assert claimed == [True], "the rival's claim came after the gate, during the review"
    assert info.value.code == "step.victim_running", info.value
    assert "scene_detail" in info.value.message and "running" in info.value.message
    assert victim_bytes(env) == before
    rival = env.row("scene_detail")
    assert rival is not None and (rival.status, rival.run_id) == ("running", "rival:0")
    entity = env.row("entity_t2i")
    assert entity == rows_before["entity_t2i"], "the other victim's row is untouched too"
    assert not [t for t in ledger.transitions() if t.action == "mutated"]
    review = env.row("t2i_review")
    assert review is not None and review.status == "failed", review
