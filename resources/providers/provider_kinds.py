"""The registry of provider kinds: which text and image models each ``provider.kind`` makes.

A kind is one module and one line (docs/ARCHITECTURE.md, Recipes):

- the module ``resources/providers/kinds/<kind>.py``, with ``text_model(config)`` and
  ``image_model(config)`` (:class:`ProviderKind`), each given the project's
  :class:`~pipeline_defs.project.ProviderConfig`;
- the line: its name in ``PROVIDER_KINDS`` (``pipeline_defs/project.py``), the list
  ``provider.kind`` is checked against when a project file is read.

The list stays in the pure core because the core reads project files and imports no
adapter (import-linter's layers); the module is found here by the name, so nothing else
lists the kinds. ``tests/core/test_provider_kinds.py`` keeps every name a module with both
functions and every module a name.
"""

import importlib
from typing import Protocol, cast

from pipeline_defs import project
from pipeline_defs.project import ProviderConfig
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.providers.base import ImageModel, TextModel

# Where the kinds' modules live: ``<KINDS_PACKAGE>.<kind>``.
KINDS_PACKAGE = "resources.providers.kinds"


class ProviderKind(Protocol):
    """What a kind's module holds: its two model factories."""

    def text_model(self, config: ProviderConfig) -> TextModel: ...

    def image_model(self, config: ProviderConfig) -> ImageModel: ...


def provider_kind(name: str) -> ProviderKind:
    """The module of the kind ``name`` (one of ``PROVIDER_KINDS``, read now)."""
    if name not in project.PROVIDER_KINDS:
        raise PipelineError(
            ErrorCode.CONFIG_INVALID,
            f"provider.kind {name!r} is not one of {', '.join(project.PROVIDER_KINDS)}",
        )
    return cast(ProviderKind, importlib.import_module(f"{KINDS_PACKAGE}.{name}"))


def text_model_for(config: ProviderConfig) -> TextModel:
    """The text model a project's ``provider:`` section asks for."""
    return provider_kind(config.kind).text_model(config)


def image_model_for(config: ProviderConfig) -> ImageModel:
    """The image model a project's ``provider:`` section asks for."""
    return provider_kind(config.kind).image_model(config)
