"""One list of storage schemes: the settings check ``PIPELINE_STORAGE_URL`` against
``STORAGE_SCHEMES``, each a module of ``resources/storage/schemes/`` opening it, and the
storage opens exactly those. Before, the schemes were listed twice (the settings' and the
object store's) with nothing keeping them equal.

The recipe (docs/ARCHITECTURE.md, Recipes, "A storage backend") is followed once here: a
throwaway scheme, one module and one line, passes the settings and its URL opens."""

import importlib
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import ValidationError

from pipeline_defs.resume import settings
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.settings import STORAGE_SCHEMES, ResumeSettings
from resources.storage import schemes
from resources.storage.base import Storage
from resources.storage.bucket_location import BUCKET_NAMES, BUCKET_SCHEMES
from resources.storage.location import open_storage
from resources.storage.storage_schemes import SCHEMES_PACKAGE
from resources.testing import MemoryStorage


def test_every_scheme_is_a_module_and_every_module_a_scheme() -> None:
    assert {info.name for info in pkgutil.iter_modules(schemes.__path__)} == set(STORAGE_SCHEMES)
    for name in STORAGE_SCHEMES:
        assert callable(importlib.import_module(f"{SCHEMES_PACKAGE}.{name}").open_url), name
    assert set(BUCKET_SCHEMES) <= set(STORAGE_SCHEMES)
    assert set(BUCKET_NAMES) == set(BUCKET_SCHEMES)


def test_a_scheme_outside_the_list_is_refused_naming_the_list(tmp_path: Path) -> None:
    with pytest.raises(PipelineError) as refused:
        open_storage("ftp://host/prefix", home=tmp_path)
    assert refused.value.code == ErrorCode.STORAGE_INVALID_URL
    assert f"not one of {', '.join(STORAGE_SCHEMES)} (or a plain path)" in refused.value.message
    assert "not one of file, s3, gs, az" in refused.value.message


def _mem_scheme(opened: dict[str, Storage]) -> ModuleType:
    """The recipe's module: ``resources/storage/schemes/mem.py``, as a test writes it."""
    module = ModuleType(f"{SCHEMES_PACKAGE}.mem")

    def open_url(url: str, *, home: Path) -> Storage:
        return opened.setdefault(url, MemoryStorage(url.split("://", 1)[1]))

    module.open_url = open_url  # type: ignore[attr-defined]  # a module written here
    return module


def test_the_recipe_adds_a_scheme_with_one_module_and_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "mem://scratch"
    with pytest.raises(ValidationError):
        ResumeSettings(home=tmp_path, storage_url=url)  # not a scheme before the recipe
    opened: dict[str, Storage] = {}
    monkeypatch.setitem(sys.modules, f"{SCHEMES_PACKAGE}.mem", _mem_scheme(opened))  # module
    monkeypatch.setattr(settings, "STORAGE_SCHEMES", (*STORAGE_SCHEMES, "mem"))  # the line
    assert ResumeSettings(home=tmp_path, storage_url=url).storage_url == url
    storage = open_storage(url, home=tmp_path)
    assert storage is opened[url]
    storage.put_create("a/b.json", b"{}")
    assert storage.get("a/b.json") == b"{}"
