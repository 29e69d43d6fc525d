"""One list of provider kinds: ``provider.kind`` accepts exactly the kinds in
``PROVIDER_KINDS``, each a module of ``resources/providers/kinds/`` making its models, and
refuses another naming the list. Before, a new kind meant editing a ``Literal`` and
``if config.kind ==`` branches, with nothing keeping them equal.

The recipe (docs/ARCHITECTURE.md, Recipes, "A provider endpoint kind") is followed once
here: a throwaway kind, one module and one line, is accepted and makes its models."""

import importlib
import pkgutil
import sys
from types import ModuleType

import pytest
from pydantic import ValidationError

from pipeline_defs import project
from pipeline_defs.project import PROVIDER_KINDS, ProjectConfig, ProviderConfig
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.providers import kinds
from resources.providers.base import ImageModel, TextModel
from resources.providers.offline_images import OfflineImageModel
from resources.providers.offline_text import OfflineTextModel
from resources.providers.provider_kinds import (
    KINDS_PACKAGE,
    image_model_for,
    provider_kind,
    text_model_for,
)


def test_every_kind_is_a_module_with_its_models_and_every_module_a_kind() -> None:
    modules = {info.name for info in pkgutil.iter_modules(kinds.__path__)}
    assert modules == set(PROVIDER_KINDS)
    for name in PROVIDER_KINDS:
        module = importlib.import_module(f"{KINDS_PACKAGE}.{name}")
        assert callable(module.text_model) and callable(module.image_model), name


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
    with pytest.raises(PipelineError) as unlisted:
        provider_kind("anthropic")
    assert unlisted.value.code == ErrorCode.CONFIG_INVALID


class _EchoText(OfflineTextModel):
    @property
    def model_name(self) -> str:
        return "echo-text"


class _EchoImage(OfflineImageModel):
    @property
    def model_name(self) -> str:
        return "echo-image"


def _echo_kind() -> ModuleType:
    """The recipe's module: ``resources/providers/kinds/echo.py``, as a test writes it."""
    module = ModuleType(f"{KINDS_PACKAGE}.echo")

    def text_model(config: ProviderConfig) -> TextModel:
        return _EchoText()

    def image_model(config: ProviderConfig) -> ImageModel:
        return _EchoImage()

    module.text_model = text_model  # type: ignore[attr-defined]  # a module written here
    module.image_model = image_model  # type: ignore[attr-defined]  # a module written here
    return module


def test_the_recipe_adds_a_kind_with_one_module_and_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValidationError):
        ProviderConfig(kind="echo")  # not a kind before the recipe
    monkeypatch.setitem(sys.modules, f"{KINDS_PACKAGE}.echo", _echo_kind())  # the module
    monkeypatch.setattr(project, "PROVIDER_KINDS", (*PROVIDER_KINDS, "echo"))  # the line
    config = ProjectConfig.model_validate({"provider": {"kind": "echo"}}).provider
    assert config.kind == "echo"
    assert text_model_for(config).model_name == "echo-text"
    assert image_model_for(config).model_name == "echo-image"
