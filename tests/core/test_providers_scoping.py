"""Which steps a provider change concerns, and what a project's provider section resolves to."""

import pytest

from pipeline_defs.project import (
    IMAGE_MODEL_KEYS,
    TEXT_MODEL_KEYS,
    ProjectConfig,
    ProviderConfig,
    parse_project_config,
    scoped_fingerprints,
)
from pipeline_defs.resume.decision_types import fingerprint
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.storyboard import STORYBOARD_STEPS, ProjectImageModel, ProjectTextModel
from resources.providers import (
    CONFIG_ERROR,
    OfflineImageModel,
    OfflineTextModel,
    OpenAIImageModel,
    OpenAITextModel,
    TextCall,
    TextModel,
    TextReply,
)

STEPS = {s.step_id: s for s in STORYBOARD_STEPS}
OPENAI = {
    "provider": {
        "kind": "openai",
        "base_url": "http://127.0.0.1:9/v1",
        "text_model": "t-1",
        "image_model": "i-1",
    }
}


def test_model_calling_steps_scope_their_model_and_no_other() -> None:
    text = {s for s, step in STEPS.items() if "provider.text_model" in step.resume_config_keys}
    image = {s for s, step in STEPS.items() if "provider.image_model" in step.resume_config_keys}
    assert text == {
        "entity_canon",
        "world_guide",
        "scene_detail",
        "entity_t2i",
        "shot_dependency_t2i",
        "t2i_review",
    }
    assert image == {"ref_image_gen", "composite_image_gen", "scene_image_pipeline"}
    assert not any(k.startswith("provider.") for k in STEPS["story_source"].resume_config_keys)


def test_offline_defaults_keep_the_fingerprints_of_older_checkpoints() -> None:
    """An upgrade blocks nothing: provider keys at their default are not fingerprinted."""
    config = ProjectConfig().as_dict()
    keys = STEPS["entity_canon"].resume_config_keys
    older = ("entities.max_characters", "entities.min_mentions")
    assert scoped_fingerprints(config, keys) == scoped_fingerprints(config, older)


def test_an_openai_project_fingerprints_the_model_its_step_calls() -> None:
    config = parse_project_config(OPENAI, source="test").as_dict()
    text = scoped_fingerprints(config, STEPS["entity_canon"].resume_config_keys)
    image = scoped_fingerprints(config, STEPS["ref_image_gen"].resume_config_keys)
    assert set(TEXT_MODEL_KEYS) <= set(text) and "provider.image_model" not in text
    assert set(IMAGE_MODEL_KEYS) <= set(image) and "provider.text_model" not in image
    assert text["provider.text_model"] == fingerprint("t-1")
    # back to the default: the saved fingerprint has the key, the current one not: a change
    offline = scoped_fingerprints(
        ProjectConfig().as_dict(), STEPS["entity_canon"].resume_config_keys
    )
    assert {k for k in text if text.get(k) != offline.get(k)} == set(TEXT_MODEL_KEYS)


def test_shipped_resources_route_per_project(monkeypatch: pytest.MonkeyPatch) -> None:
    offline = ProviderConfig()
    assert isinstance(ProjectTextModel().for_provider(offline), OfflineTextModel)
    assert isinstance(ProjectImageModel().for_provider(offline), OfflineImageModel)
    project = parse_project_config(OPENAI, source="test").provider
    text, image = (
        ProjectTextModel().for_provider(project),
        ProjectImageModel().for_provider(project),
    )
    assert isinstance(text, OpenAITextModel) and isinstance(image, OpenAIImageModel)
    assert (text.model, image.model) == ("t-1", "i-1")
    # the router itself never answers: it would pick a provider for no project
    with pytest.raises(PipelineError) as info:
        ProjectTextModel().complete(TextCall("entity_canon", "p", {}))
    assert info.value.code == CONFIG_ERROR


def test_an_injected_model_answers_for_every_project() -> None:
    class Fake(TextModel):
        def complete(self, call: TextCall) -> TextReply:
            return TextReply(data={}, units=1, model="fake")

    fake = Fake()
    project = parse_project_config(OPENAI, source="test").provider
    assert fake.for_provider(project) is fake
    fake.for_provider(project).preflight()  # no key needed for a fake


def test_provider_section_is_validated_by_name() -> None:
    with pytest.raises(PipelineError) as info:
        parse_project_config({"provider": {"api_key_env": "not a name"}}, source="p.yaml")
    assert info.value.code == "config.invalid"
    assert "provider.api_key_env" in info.value.message
    secret = "sk-never-in-a-repr-123"
    assert secret not in repr(ProviderConfig(api_key=secret))
