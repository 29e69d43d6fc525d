"""Inputs and contracts: the story file, project.yaml, the step table, the providers."""

import json
import time
from collections.abc import Iterator

import pytest
from storyboard_support import (
    PRE_REVIEW,
    STEP_IDS,
    STEPS,
    TEST_CONFIG,
    Env,
    scratch_dir,
    write_episode,
)

from pipeline_defs.project import (
    ABSENT,
    ProjectConfig,
    ProviderConfig,
    load_project_config,
    lookup,
)
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.steps.context import StepContext
from pipeline_defs.storyboard import (
    STORYBOARD_STEPS,
    default_image_model,
    default_text_model,
    provider_models,
    sample_stories,
)
from pipeline_defs.storyboard.providers import offline_latency_ms
from pipeline_defs.storyboard.story_source import parse_story
from resources.providers import (
    OFFLINE_TEXT_MODEL,
    OfflineImageModel,
    OfflineTextModel,
    OpenAIImageModel,
    OpenAITextModel,
    TextCall,
)
from resources.providers.openai_http import resolve_api_key


@pytest.fixture
def blank() -> Iterator[Env]:
    blank = Env.sqlite(scratch_dir("inputs"))
    yield blank
    blank.destroy()


def story_context(blank: Env) -> StepContext:
    """The judge's context of story_source, owned as a run's (the body only reads)."""
    read = blank.step_judge("story_source").context(blank.key("story_source"))
    return StepContext.owned(
        read, checkpoints=blank.checkpoints, ledger=blank.ledger, run_id="inputs-test:0"
    )


# ----------------------------------------------------------------------------- the story
@pytest.mark.parametrize(
    ("story", "config", "problem"),
    [
        (None, {}, "is missing"),
        ("  \n\n \t\n", {}, "is empty"),
        ("word " * 100, {"story": {"max_bytes": 200}}, "over the story.max_bytes limit of 200"),
        ("caf\xe9 story".encode("latin-1"), {}, "is not UTF-8"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", {}, "is binary"),
        ("text with a bell \x07 in it", {}, "control characters"),
        ("# Only a title\n\n## A heading\n", {}, "no story text"),
    ],
    ids=["missing", "empty", "oversized", "non-utf8", "binary", "control-chars", "no-text"],
)
def test_story_source_refuses_bad_input_naming_the_file(
    blank: Env, story: str | bytes | None, config: dict[str, object], problem: str
) -> None:
    path = write_episode(blank.home, story=story or "", config=config)
    if story is None:
        path.unlink()
    with pytest.raises(PipelineError) as info:
        STEPS["story_source"].execute(story_context(blank), {})
    assert info.value.code == "story_source.invalid_input"
    assert str(path) in info.value.message
    assert problem in info.value.message


def test_story_source_normalizes_and_cuts_scenes(blank: Env) -> None:
    story = (
        "\ufeff# Title\r\n\r\n## One\r\nMira ran.   \r\n\r\n\r\n\r\nTobin ran.\r\n"
        "## Two\r\nEnd.\r\n"
    )
    write_episode(blank.home, story=story, config={})
    data = STEPS["story_source"].execute(story_context(blank), {}).data

    assert data["title"] == "Title"
    assert [s["heading"] for s in data["scenes"]] == ["One", "Two"]
    assert data["scenes"][0]["text"] == "Mira ran.\n\nTobin ran."
    assert "\r" not in data["text"] and not data["text"].startswith("\ufeff")
    assert data["story_file"] == "story.md" and len(data["story_sha256"]) == 64


def test_story_without_headings_becomes_paragraph_scenes() -> None:
    text = "\n\n".join(f"Paragraph {i} " + "word " * 20 for i in range(6))
    parsed = parse_story(text, segment_chars=250)
    assert [s["heading"] for s in parsed["scenes"]] == ["Part 1", "Part 2", "Part 3"]
    assert all(len(s["segment_indices"]) == 1 for s in parsed["scenes"])


# ----------------------------------------------------------------------------- project.yaml
def test_unknown_project_key_is_refused_by_name(blank: Env) -> None:
    write_episode(blank.home, config={"scenes": {"shot_per_scene": 3}})
    with pytest.raises(PipelineError) as info:
        load_project_config(blank.home, "demo")
    assert info.value.code == "config.invalid"
    assert "scenes.shot_per_scene" in info.value.message and "unknown key" in info.value.message
    with pytest.raises(PipelineError) as info:
        blank.run_direct(["story_source"])
    assert "scenes.shot_per_scene" in info.value.message


def test_every_resume_config_key_names_a_real_setting() -> None:
    defaults = ProjectConfig().as_dict()
    for step in STORYBOARD_STEPS:
        for key in step.resume_config_keys:
            assert lookup(defaults, key) is not ABSENT, f"{step.step_id}: {key}"


# ----------------------------------------------------------------------------- step table
def test_only_entity_t2i_may_rerun_on_a_schema_bump() -> None:
    allowed = {s.step_id for s in STORYBOARD_STEPS if s.allow_auto_rerun_on_schema_bump}
    assert allowed == {"entity_t2i"}


def test_steps_match_the_spec_table_in_dependency_order() -> None:
    assert {s.step_id: s.deps for s in STORYBOARD_STEPS} == {
        "story_source": (),
        "entity_canon": ("story_source",),
        "world_guide": ("story_source", "entity_canon"),
        "scene_detail": ("story_source", "entity_canon", "world_guide"),
        "entity_t2i": ("entity_canon",),
        "shot_dependency_t2i": ("scene_detail",),
        "t2i_review": ("scene_detail", "entity_t2i"),
        "ref_image_gen": ("entity_canon", "entity_t2i", "t2i_review"),
        "composite_image_gen": ("ref_image_gen",),
        "scene_image_pipeline": (
            "scene_detail",
            "shot_dependency_t2i",
            "composite_image_gen",
            "t2i_review",
        ),
    }
    for index, step in enumerate(STORYBOARD_STEPS):
        assert set(step.deps) <= set(STEP_IDS[:index]), step.step_id
    mutators = {
        s.step_id: s.modifies_checkpoints for s in STORYBOARD_STEPS if s.modifies_checkpoints
    }
    assert mutators == {"t2i_review": ("scene_detail", "entity_t2i")}
    assert "scenes.shots_per_scene" in STEPS["scene_detail"].resume_config_keys


# ----------------------------------------------------------------------------- providers
def test_default_models_read_latency_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the models (at import of the code location) reads no environment; each
    call does, so a changed PIPELINE_OFFLINE_LATENCY_MS applies without a reload."""
    monkeypatch.setenv("PIPELINE_OFFLINE_LATENCY_MS", "-3")
    text, image = default_text_model(), default_image_model()  # building never reads it
    assert text == OfflineTextModel() and image == OfflineImageModel()
    with pytest.raises(PipelineError) as info:
        text.complete(_canon_call("ep01"))
    assert info.value.code == "settings.invalid"
    assert "PIPELINE_OFFLINE_LATENCY_MS" in info.value.message
    monkeypatch.setenv("PIPELINE_OFFLINE_LATENCY_MS", "7")
    assert offline_latency_ms() == 7
    monkeypatch.delenv("PIPELINE_OFFLINE_LATENCY_MS")
    assert offline_latency_ms() == 0


def test_provider_selection_follows_the_project(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPELINE_PROVIDER_API_KEY", raising=False)
    text, image = provider_models(ProviderConfig())
    assert isinstance(text, OfflineTextModel) and isinstance(image, OfflineImageModel)

    config = ProviderConfig(
        kind="openai", base_url="http://127.0.0.1:9/v1", text_model="t", image_model="i"
    )
    text, image = provider_models(config.model_copy(update={"api_key": "from-yaml"}))
    assert isinstance(text, OpenAITextModel) and isinstance(image, OpenAIImageModel)
    assert (text.model, image.model, text.api_key_env) == ("t", "i", "PIPELINE_PROVIDER_API_KEY")
    assert resolve_api_key(text.api_key_env, text.api_key) == "from-yaml"

    monkeypatch.setenv("PIPELINE_PROVIDER_API_KEY", "from-env")  # the environment wins
    text, _ = provider_models(config.model_copy(update={"api_key": "from-yaml"}))
    assert isinstance(text, OpenAITextModel)
    assert resolve_api_key(text.api_key_env, text.api_key) == "from-env"

    with pytest.raises(PipelineError) as info:
        provider_models(ProviderConfig(kind="openai"))
    assert info.value.code == "config.invalid"


def _canon_call(episode: str) -> TextCall:
    text = sample_stories()[episode].read_text(encoding="utf-8")
    scenes = text.split("\n## ")[1:]
    segments = [
        {"segment_index": i, "scene_index": i + 1, "text": s.split("\n", 1)[1]}
        for i, s in enumerate(scenes)
    ]
    return TextCall(
        "entity_canon",
        "list characters",
        {"segments": segments, "min_mentions": 2, "max_characters": 6},
    )


def test_offline_text_model_is_deterministic_and_reads_the_story() -> None:
    model = OfflineTextModel()
    first, second = model.complete(_canon_call("ep01")), model.complete(_canon_call("ep01"))
    assert json.dumps(first.data, sort_keys=True) == json.dumps(second.data, sort_keys=True)
    assert first.model == OFFLINE_TEXT_MODEL and first.units > 1
    cast = {c["name"]: c for c in first.data["characters"]}
    assert set(cast) == {"Mira", "Tobin", "Ysolde", "Pell"}
    assert [o["description"] for o in cast["Mira"]["outlooks"]] == [
        "grey wool smock patched at the elbows",
        "red storm coat",
    ]
    assert [o["description"] for o in cast["Tobin"]["outlooks"]] == ["yellow oilskin jacket"]
    other = {c["name"] for c in model.complete(_canon_call("ep02")).data["characters"]}
    assert other == {"Mira", "Tobin", "Corvin", "Ysolde"}


def test_offline_text_model_refuses_unknown_tasks_and_bad_payloads() -> None:
    with pytest.raises(PipelineError) as info:
        OfflineTextModel().complete(TextCall("poetry", "a poem", {}))
    assert info.value.code == "provider.config"
    with pytest.raises(PipelineError) as info:
        OfflineTextModel().complete(TextCall("entity_canon", "x", {"segments": "nope"}))
    assert info.value.code == "input.invalid"


def test_offline_text_latency_is_simulated() -> None:
    started = time.monotonic()
    OfflineTextModel(latency_ms=50).complete(_canon_call("ep01"))
    assert time.monotonic() - started >= 0.05


@pytest.mark.parametrize("episode", ["ep01", "ep02"])
def test_offline_reviewer_finds_fixes_on_both_samples(blank: Env, episode: str) -> None:
    """The demo exercises the mutator: both sample stories get a non-empty fix set."""
    write_episode(blank.home, episode=episode)

    outcomes = blank.run_direct((*PRE_REVIEW, "t2i_review"), episode=episode)

    assert outcomes["t2i_review"].mutated == ("scene_detail", "entity_t2i")
    review = blank.checkpoint("t2i_review", episode)
    assert review is not None
    assert review.data["applied"]["scene_detail"] and review.data["applied"]["entity_t2i"]


def test_sample_stories_are_bundled_markdown_of_a_few_hundred_words() -> None:
    stories = sample_stories()
    assert sorted(stories) == ["ep01", "ep02"]
    for path in stories.values():
        assert path.suffix == ".md" and path.is_file()
        assert 250 <= len(path.read_text(encoding="utf-8").split()) <= 600


def test_review_disabled_is_not_applicable_and_images_still_follow(blank: Env) -> None:
    write_episode(blank.home, config={**TEST_CONFIG, "review": {"enabled": False}})

    outcomes = blank.run_direct()

    assert outcomes["t2i_review"].status == "not_applicable"
    assert outcomes["t2i_review"].mutated == ()
    assert blank.checkpoint_of("scene_detail").mutations == ()
    row = blank.row("t2i_review")
    assert row is not None and row.status == "not_applicable"
    for step_id in ("ref_image_gen", "composite_image_gen", "scene_image_pipeline"):
        assert outcomes[step_id].status == "completed", step_id
