"""The registry of storage schemes: how a storage URL of each scheme opens.

A scheme is one module and one line (docs/ARCHITECTURE.md, Recipes):

- the module ``resources/storage/schemes/<scheme>.py``, with ``open_url(url, *, home)``
  (:class:`StorageScheme`) returning a :class:`~resources.storage.base.Storage`;
- the line: its name in ``STORAGE_SCHEMES`` (``pipeline_defs/resume/settings.py``), the
  list ``PIPELINE_STORAGE_URL`` is checked against when the settings are read.

The list stays in the pure core because the settings are read there, importing no adapter
(import-linter's layers); the module is found here by the name, so nothing else lists the
schemes. ``tests/core/test_storage_schemes.py`` keeps every name a module and every
module a name.
"""

import importlib
from pathlib import Path
from typing import Protocol, cast

from pipeline_defs.resume import settings
from resources.storage.base import Storage

# Where the schemes' modules live: ``<SCHEMES_PACKAGE>.<scheme>``.
SCHEMES_PACKAGE = "resources.storage.schemes"


class StorageScheme(Protocol):
    """What a scheme's module holds: how a URL of it opens."""

    def open_url(self, url: str, *, home: Path) -> Storage: ...


def storage_schemes() -> tuple[str, ...]:
    """The schemes a storage URL may name (``STORAGE_SCHEMES``, read now)."""
    return settings.STORAGE_SCHEMES


def storage_scheme(name: str) -> StorageScheme | None:
    """The module of the scheme ``name``; None if it is not one of ``STORAGE_SCHEMES``."""
    if name not in storage_schemes():
        return None
    return cast(StorageScheme, importlib.import_module(f"{SCHEMES_PACKAGE}.{name}"))
