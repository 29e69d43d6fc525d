"""Storyboard pipeline code location. ``pipeline_defs.defs`` is the Definitions object.

The attribute is resolved lazily so that importing the pure judge
(``pipeline_defs.resume``) never pulls in Dagster. ``__dir__`` names it, so Dagster's module
loader (``dagster dev -m pipeline_defs``, which lists a module's members) finds it too.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "defs":
        from pipeline_defs.definitions import defs

        return defs
    raise AttributeError(f"module 'pipeline_defs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "defs"])
