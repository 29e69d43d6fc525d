"""The published pointer of a step, as the checkpoint store over a bucket reads it.

The pointers come from the ledger (its rows' ``checkpoint_pointer``); the caller
(``resources/pipeline.py``) builds a :class:`PointerSource` over it, so the checkpoint
adapters never import the ledger's.
"""

import hashlib
from collections.abc import Mapping, Sequence
from typing import Protocol

from pipeline_defs.resume.partition import StepKey


class PointerSource(Protocol):
    """The published pointer of a step: its ledger row's ``checkpoint_pointer``."""

    def pointer(self, key: StepKey) -> str | None: ...

    def episode_pointers(self, project_id: str, episode_id: str) -> Mapping[str, str | None]:
        """Step id -> pointer of every row of one episode (one read)."""
        ...

    def archived_pointers(self, key: StepKey) -> Sequence[str]:
        """The pointers the step's row archived (a force, a replacement), newest first."""
        ...

    def row_pointer(self, key: StepKey) -> tuple[bool, str | None]:
        """Whether the ledger has a row for ``key`` at all, and its pointer: one read."""
        ...


def pointer_digest(text: str) -> str:
    """What a copy's marker and a seal record of a pointer: the sha256 of its text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
