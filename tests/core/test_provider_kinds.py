"""One list of provider kinds: ``provider.kind`` accepts exactly the kinds the code
location's router makes models for, and refuses another naming the list. Before, a new kind
meant editing a ``Literal`` and ``if config.kind ==`` branches, with nothing keeping them equal."""

import pytest
from pydantic import ValidationError

from pipeline_defs.project import PROVIDER_KINDS, ProviderConfig
from pipeline_defs.storyboard.providers import PROVIDER_MODELS, image_model_for, text_model_for


def test_every_kind_has_its_models_and_nothing_else() -> None:
    assert set(PROVIDER_MODELS) == set(PROVIDER_KINDS)


def test_each_kind_makes_its_models() -> None:
    offline = ProviderConfig()
    assert text_model_for(offline).model_name == "offline-text-v1"
    assert image_model_for(offline).model_name == "offline-image-v1"
    remote = ProviderConfig(kind="openai", base_url="http://127.0.0.1:9/v1", text_model="t")
    assert text_model_for(remote).model_name == "t"


def test_an_unknown_kind_is_refused_naming_the_kinds() -> None:
    with pytest.raises(ValidationError) as refused:
        ProviderConfig(kind="anthropic")
    assert f"'anthropic' is not one of {', '.join(PROVIDER_KINDS)}" in str(refused.value)
