"""Write-ahead edits: a mutator's edited victim envelopes, durable before it publishes.

A mutator step (:mod:`pipeline_defs.steps.mutations`) writes each edit of a victim step
here first, under its own step directory (``pending/<victim>.json``); whoever finds one
after a crash compares it with the published intent before settling it.
"""

import contextlib
import json
from pathlib import Path

from pipeline_defs.resume.errors import PipelineError, SymlinkRefused
from pipeline_defs.resume.files import read_nofollow
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.atomic import atomic_write_bytes
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.links import LinkPolicy
from resources.checkpoints.paths import StorePaths


class PendingFiles:
    """The write-ahead edits of one home's mutators, as files in the mutator's step
    directory (no state of its own)."""

    def __init__(self, paths: StorePaths, links: LinkPolicy) -> None:
        self.paths = paths
        self.links = links

    def _refuse_pending_links(self, mutator: StepKey, victim: str) -> Path:
        path = self.paths.pending_path(mutator, victim)
        self.links.refuse_links_to(mutator, DataLayout.pending_entry(victim))
        return path

    def write_pending(self, mutator: StepKey, edited: Checkpoint) -> Path:
        """Write ahead an edited victim envelope (durable before the mutator publishes)."""
        path = self._refuse_pending_links(mutator, edited.step_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, edited.to_json().encode("utf-8"))
        return path

    def load_pending(self, mutator: StepKey, victim: str) -> Checkpoint | None:
        """The written-ahead edit of ``victim``; None if absent or unreadable (never trusted
        beyond its content hash, which the caller compares with the published intent).

        A link in its place is no "absent": it raises ``checkpoint.symlink``.
        """
        path = self._refuse_pending_links(mutator, victim)
        try:
            raw = json.loads(read_nofollow(path))
            return Checkpoint.from_dict(raw, source=str(path))
        except SymlinkRefused:
            raise
        except (OSError, ValueError, PipelineError):
            return None

    def drop_pending(self, mutator: StepKey, victim: str) -> None:
        path = self._refuse_pending_links(mutator, victim)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
