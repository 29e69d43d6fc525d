"""What read-only code may ask of the stores, as types: the ledger and checkpoint reads of
the step judge, a verifier's context, batch judgement and the sensor's tick.

``resources.ledger.store.LedgerStore`` and ``resources.checkpoints.store.CheckpointStore``
(over a home or over object storage) satisfy these protocols structurally;
code typed with them can call nothing else, so mypy proves it writes no row, no
checkpoint, no artifact and no seal. The writers (``steps.runner``, ``steps.accept``, the
sensor's scrub) hold the full stores. Widening a protocol here widens what every judge may
do: ``tests/core/test_readers_by_type.py`` pins the members.

Two reads touch local state: ``sync_inputs`` copies the published inputs into this
process's home on object storage (a cache; nothing on a local home), and ``judging_scope``
lets a batch lstat each ancestor once. Neither writes a ledger row or a published object.
"""

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from pipeline_defs.resume.layout import DataLayout, FileIdentity
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.seal import Seal


class LedgerReader(Protocol):
    """The ledger reads of judging: one row, many rows, the change cursor, where it is."""

    @property
    def url(self) -> str:
        """The ledger's database URL (a cursor's scope; a worker process opens its own)."""
        ...

    def get(self, key: StepKey) -> LedgerRow | None: ...

    def get_many(
        self,
        *,
        episodes: Iterable[Episode] | None = None,
        step_ids: Iterable[str] | None = None,
        changed_since: tuple[int, str] | None = None,
        columns: Sequence[str] | None = None,
    ) -> dict[StepKey, LedgerRow]: ...

    def cursor(self) -> tuple[int, str]: ...

    def episode_calls(self, project_id: str, episode_id: str) -> int:
        """The provider calls the episode has recorded, all its runs (the spend cap's count)."""
        ...

    def episode_estimate(self, project_id: str, episode_id: str) -> int | None:
        """The calls the episode's story was estimated at when registered (None: unknown)."""
        ...


class CheckpointReader(Protocol):
    """The checkpoint reads of judging: paths, envelopes, artifact checks, seals."""

    @property
    def home(self) -> Path: ...

    @property
    def layout(self) -> DataLayout: ...

    @property
    def scan_layout(self) -> DataLayout: ...

    @property
    def poolable(self) -> bool: ...

    def sync_inputs(self, project_id: str, episode_id: str | None = None) -> None: ...

    def judging_scope(self) -> AbstractContextManager[None]: ...

    def step_dir(self, key: StepKey) -> Path: ...

    def path_for(self, key: StepKey) -> Path: ...

    def artifact_path(self, key: StepKey, relative: str) -> Path: ...

    def refuse_links_in_tree(self, key: StepKey) -> None: ...

    def with_companions(self, key: StepKey, artifacts: Iterable[str]) -> list[str]: ...

    def archived_artifacts(self, key: StepKey) -> dict[str, set[str]]: ...

    def not_regular(self, key: StepKey, relatives: Iterable[str]) -> tuple[Path, int] | None: ...

    def artifact_sha256(self, key: StepKey, relative: str) -> str | None:
        """The sha256 of an artifact's bytes as they are now; None when it is absent or
        not a file."""
        ...

    def episode_input_files(self, key: StepKey) -> list[Path]:
        """The regular files directly in ``key``'s episode input directory
        (``projects/<p>/episodes/<e>/``), sorted; [] when it cannot be listed."""
        ...

    def load(self, key: StepKey) -> Checkpoint | None: ...

    def artifact_problems(self, checkpoint: Checkpoint) -> tuple[list[str], list[str]]: ...

    def sealed(
        self,
        key: StepKey,
        text: Any,
        shared: Callable[[str], FileIdentity | None] = ...,
    ) -> Seal | None: ...
