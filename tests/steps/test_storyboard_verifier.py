"""Verifiers on fixture checkpoints: every origin branch of scene_detail, image steps, story.

Fixtures are the real checkpoints of a pipeline run, edited in memory the way production
data went wrong; the real ``verify_completion`` (and the judge over it) classifies them.
"""

import copy
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from storyboard_support import STEPS, Env, cloned, scratch_dir, write_episode

from pipeline_defs.resume.completion import CompletionReport, Origin, Severity
from pipeline_defs.resume.decision_types import LaunchMode, ResumeAction
from pipeline_defs.resume.errors import PipelineError
from resources.checkpoints.envelope import Checkpoint

Edit = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def home() -> Iterator[Env]:
    env = Env.sqlite(scratch_dir("verify"))
    write_episode(env.home)
    env.run_direct()
    yield env
    env.destroy()


def edited(checkpoint: Checkpoint, edit: Edit) -> Checkpoint:
    data = copy.deepcopy(dict(checkpoint.data))
    edit(data)
    return checkpoint.with_changes(data=data)


def verify(env: Env, step_id: str, checkpoint: Checkpoint) -> CompletionReport:
    runtime = env.step_judge(step_id)
    return STEPS[step_id].verify_completion(runtime.context(env.key(step_id)), checkpoint)


def scene_detail(env: Env, edit: Edit) -> Checkpoint:
    checkpoint = env.checkpoint("scene_detail")
    assert checkpoint is not None
    return edited(checkpoint, edit)


def variation(data: dict[str, Any], list_index: int, v: int = 0) -> dict[str, Any]:
    return data["scenes"][list_index]["t2i_variations"][v]  # type: ignore[no-any-return]


def _set(path: tuple[Any, ...], value: Any) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        node: Any = data
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value

    return edit


def _delete(path: tuple[Any, ...]) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        node: Any = data
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]

    return edit


def _append_to_prompt(list_index: int) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        variation(data, list_index)["t2i_prompt"] += " (edited by hand)"

    return edit


V = ("t2i_variations", 0)
CASES: list[tuple[str, Edit, Origin, Severity, str]] = [
    (
        "loader shape violation",
        _set(("scenes", 0, "t2i_variations"), "not a list"),
        Origin.CONTRACT_DRIFT,
        Severity.PARTIAL,
        "L0: t2i_variations",
    ),
    (
        "no scenes list at all",
        _set(("scenes",), {"S1": []}),
        Origin.CONTRACT_DRIFT,
        Severity.MISSING,
        "scenes: data.scenes",
    ),
    (
        "card recompute raises a typed error",
        _set(("scenes", 1, *V, "render_prompt_card"), ["not", "a", "card"]),
        Origin.CONTRACT_DRIFT,
        Severity.PARTIAL,
        "S1_L1_V0: render_prompt_card is list",
    ),
    (
        "card of an unknown template",
        _set(("scenes", 1, *V, "render_prompt_card", "template"), "shot-card/v9"),
        Origin.CONTRACT_DRIFT,
        Severity.PARTIAL,
        "unknown template 'shot-card/v9'",
    ),
    (
        "stored t2i_prompt_hash differs from the prompt",
        _append_to_prompt(2),
        Origin.INVARIANT_DRIFT,
        Severity.PARTIAL,
        "S2_L2_V0: owned_validation.t2i_prompt_hash is stale",
    ),
    (
        "stored card hash differs from the card",
        _set(("scenes", 3, *V, "render_prompt_card", "setting"), "somewhere else"),
        Origin.INVARIANT_DRIFT,
        Severity.PARTIAL,
        "S2_L3_V0: render_prompt_card_hash does not match the card",
    ),
    (
        "camera direction edited under its sentinel",
        _set(("scenes", 4, "camera_direction"), "dutch angle"),
        Origin.INVARIANT_DRIFT,
        Severity.PARTIAL,
        "S3_L4_V0: owned_validation.camera_direction_hash is stale",
    ),
    (
        "owned_validation missing",
        _delete(("scenes", 5, *V, "owned_validation")),
        Origin.CONTRACT_DRIFT,
        Severity.PARTIAL,
        "S3_L5_V0: owned_validation is missing",
    ),
    (
        "owned_validation without validator",
        _delete(("scenes", 5, *V, "owned_validation", "validator")),
        Origin.CONTRACT_DRIFT,
        Severity.PARTIAL,
        "owned_validation lacks ['validator']",
    ),
    (
        "owned_validation hash of the wrong type",
        _set(("scenes", 6, *V, "owned_validation", "owned_hash"), 42),
        Origin.CONTRACT_DRIFT,
        Severity.PARTIAL,
        "owned_validation.owned_hash is not a sha256",
    ),
    (
        "render_prompt_card absent",
        _delete(("scenes", 7, *V, "render_prompt_card")),
        Origin.CONTRACT_DRIFT,
        Severity.PARTIAL,
        "S4_L7_V0: render_prompt_card is absent",
    ),
    (
        "render_prompt_card_hash absent",
        _delete(("scenes", 7, *V, "render_prompt_card_hash")),
        Origin.CONTRACT_DRIFT,
        Severity.PARTIAL,
        "S4_L7_V0: render_prompt_card_hash is absent",
    ),
]


def test_real_scene_detail_verifies_clean(home: Env) -> None:
    report = verify(home, "scene_detail", scene_detail(home, lambda d: None))
    assert report.is_complete and report.origin is Origin.CLEAN


@pytest.mark.parametrize(
    ("edit", "origin", "severity", "text"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_scene_detail_verifier_classifies(
    home: Env, edit: Edit, origin: Origin, severity: Severity, text: str
) -> None:
    report = verify(home, "scene_detail", scene_detail(home, edit))

    assert not report.is_complete
    assert report.origin is origin
    assert report.severity is severity
    assert any(text in item for item in report.missing), report.missing


def test_every_variation_drifted_is_severity_missing(home: Env) -> None:
    def edit_all(data: dict[str, Any]) -> None:
        for list_index in range(len(data["scenes"])):
            _append_to_prompt(list_index)(data)

    report = verify(home, "scene_detail", scene_detail(home, edit_all))
    assert report.origin is Origin.INVARIANT_DRIFT
    assert report.severity is Severity.MISSING
    assert len(report.missing) == 8


def test_priority_conflict_loader_violation_beats_sentinel_drift(home: Env) -> None:
    """Loader violation (contract) and a stale hash (invariant) together: contract wins."""

    def both(data: dict[str, Any]) -> None:
        _set(("scenes", 0, "t2i_variations"), "not a list")(data)
        _append_to_prompt(1)(data)

    drifted = scene_detail(home, both)
    report = verify(home, "scene_detail", drifted)

    assert report.origin is Origin.CONTRACT_DRIFT
    assert report.severity is Severity.PARTIAL
    assert any(m.startswith("L0:") for m in report.missing)
    assert any("S1_L1_V0: owned_validation.t2i_prompt_hash is stale" in m for m in report.missing)
    decision = judge_loaded(home, drifted)
    assert decision.action is ResumeAction.BLOCK
    assert decision.origin is Origin.CONTRACT_DRIFT


def judge_loaded(env: Env, checkpoint: Checkpoint) -> Any:
    key = env.key(checkpoint.step_id)
    runtime = env.step_judge(checkpoint.step_id)
    return runtime.judge(
        key, mode=LaunchMode.RESUME, row=env.ledger.get(key), loaded=(checkpoint, None)
    ).decision


def test_card_recompute_crash_propagates_and_the_judge_reports_verify_crashed(home: Env) -> None:
    broken = scene_detail(home, _delete(("scenes", 2, *V, "render_prompt_card", "caption")))

    with pytest.raises(KeyError, match="caption"):
        verify(home, "scene_detail", broken)
    decision = judge_loaded(home, broken)
    assert decision.action is ResumeAction.BLOCK
    assert decision.origin is Origin.VERIFY_CRASHED
    assert decision.code == "step.verify_crashed"
    assert "KeyError" in decision.reason


@pytest.mark.parametrize(
    ("edit", "origin", "action"),
    [
        (_append_to_prompt(3), Origin.INVARIANT_DRIFT, ResumeAction.BLOCK),
        (_delete(("scenes", 3, *V, "owned_validation")), Origin.CONTRACT_DRIFT, ResumeAction.BLOCK),
    ],
    ids=["invariant", "contract"],
)
def test_judge_blocks_drift_never_reruns(
    home: Env, edit: Edit, origin: Origin, action: ResumeAction
) -> None:
    decision = judge_loaded(home, scene_detail(home, edit))
    assert decision.action is action
    assert decision.origin is origin


@pytest.mark.parametrize(
    ("edit", "origin"),
    [
        (_append_to_prompt(0), Origin.INVARIANT_DRIFT),
        (_delete(("scenes", 0, *V, "owned_validation", "validator")), Origin.CONTRACT_DRIFT),
    ],
    ids=["stale-hash", "malformed-sentinel"],
)
def test_validate_data_refuses_corrupt_data_with_its_origin(
    home: Env, edit: Edit, origin: Origin
) -> None:
    checkpoint = scene_detail(home, edit)
    with pytest.raises(PipelineError) as info:
        STEPS["scene_detail"].validate_data(checkpoint.data, source="/x/checkpoint.json")
    assert info.value.code == "io.integrity_violation"
    assert info.value.origin == origin.value
    assert "/x/checkpoint.json" in info.value.message
    STEPS["scene_detail"].validate_data(scene_detail(home, lambda d: None).data, source="ok")


def test_entity_t2i_validate_data_checks_prompt_hashes(home: Env) -> None:
    checkpoint = home.checkpoint("entity_t2i")
    assert checkpoint is not None
    STEPS["entity_t2i"].validate_data(checkpoint.data, source="ok")
    stale = edited(checkpoint, _set(("prompts", 0, "t2i_prompt"), "changed"))
    with pytest.raises(PipelineError) as info:
        STEPS["entity_t2i"].validate_data(stale.data, source="ok")
    assert info.value.origin == Origin.INVARIANT_DRIFT.value


@pytest.mark.parametrize(
    "step_id", ["ref_image_gen", "composite_image_gen", "scene_image_pipeline"]
)
def test_image_verifier_lists_missing_and_changed_files(home: Env, step_id: str) -> None:
    with cloned(home) as env:
        checkpoint = env.checkpoint(step_id)
        assert checkpoint is not None
        assert verify(env, step_id, checkpoint).is_complete
        entries = sorted(checkpoint.data["images"].values(), key=lambda e: e["path"])
        (env.step_dir(step_id) / entries[0]["path"]).unlink()
        (env.step_dir(step_id) / entries[1]["path"]).write_bytes(b"not the picture")

        report = verify(env, step_id, checkpoint)
        # Other bytes are drift, a block naming the file (an older copy put
        # back would otherwise be adopted); only plain absence is re-run.
        assert report.origin is Origin.INVARIANT_DRIFT
        assert report.severity is Severity.PARTIAL
        assert set(report.missing) == {
            f"{entries[0]['path']} (missing)",
            f"{entries[1]['path']} (sha256 mismatch)",
        }
        assert env.judge(step_id).action is ResumeAction.BLOCK
        for entry in entries[1:]:
            (env.step_dir(step_id) / entry["path"]).unlink()
        assert verify(env, step_id, checkpoint).severity is Severity.MISSING
        decision = env.judge(step_id)
        assert decision.action is ResumeAction.RERUN_SELF
        assert decision.origin is Origin.ARTIFACT_MISSING


def test_skipped_reference_characters_are_not_missing(home: Env) -> None:
    checkpoint = home.checkpoint("ref_image_gen")
    assert checkpoint is not None
    assert [s["item_id"] for s in checkpoint.data["skipped"]] == ["C03"]
    assert "C03" not in checkpoint.data["expected"]
    assert verify(home, "ref_image_gen", checkpoint).is_complete


def test_story_edited_after_its_checkpoint_blocks_naming_file_and_hashes(home: Env) -> None:
    with cloned(home) as env:
        story = env.home / "projects/demo/episodes/ep01/story.md"
        recorded = env.checkpoint_of("story_source").data["story_sha256"]
        story.write_text(story.read_text() + "\nA new last line.\n")
        current = hashlib.sha256(story.read_bytes()).hexdigest()

        decision = env.judge("story_source")
        assert decision.action is ResumeAction.BLOCK
        assert decision.origin is Origin.CONTRACT_DRIFT
        assert str(story) in decision.reason
        assert recorded in decision.reason and current in decision.reason

        story.unlink()
        decision = env.judge("story_source")
        assert decision.action is ResumeAction.BLOCK
        assert "missing" in decision.reason
