"""A step's ledger status and the ledger row, typed once where the store reads it.

Both live in the pure core: the judge (``decide``) takes a :class:`LedgerRow` and the ledger
store (an adapter, a layer above) builds them, so neither has to normalise raw dicts.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any


class StepStatus(StrEnum):
    """``step_run.status``: the ledger's CHECK constraint allows exactly these."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    PARTIAL = "partial"
    FAILED = "failed"
    STALE = "stale"
    NOT_APPLICABLE = "not_applicable"


# A step that finished one way or another: the row records when (completed_at).
TERMINAL_STATUSES = frozenset(
    {StepStatus.COMPLETED, StepStatus.PARTIAL, StepStatus.FAILED, StepStatus.NOT_APPLICABLE}
)
# A row whose checkpoint other steps may read or edit (a partial one is kept, not retried).
SETTLED_RESULT = frozenset({StepStatus.COMPLETED, StepStatus.PARTIAL})

_BY_TEXT: dict[str, StepStatus] = {s.value: s for s in StepStatus}


def parse_status(value: Any) -> StepStatus | str:
    """The status as the judge compares it (stripped, lower case; ``unknown`` for none).

    Text the ledger would refuse (a hand-built row, a ledger before migration 0005) stays
    text, so the judge still treats it as an unsettled status instead of failing on it.
    """
    found = _BY_TEXT.get(value) if type(value) is str else None
    if found is not None:  # the ledger's own text: the common case, kept cheap
        return found
    if value is None:
        return "unknown"
    if type(value) is StepStatus:
        return value
    text = str(value).strip().lower()
    return _BY_TEXT.get(text, text)


def _count(value: Any) -> int:
    try:
        return int(value) if value is not None else 0
    except (TypeError, ValueError):
        return 0


@dataclass(frozen=True)
class LedgerRow:
    """One ``step_run`` row. Timestamps stay the ISO text the ledger holds: the claim's
    compare-and-set needs the exact text the judge read.

    A column a bulk reader did not fetch (``get_many(columns=...)``) is None. Not a mapping:
    a column is read as an attribute, so a misspelt one fails the type check, not a test.
    """

    project_id: str | None = None
    episode_id: str | None = None
    step_id: str | None = None
    status: StepStatus | str = "unknown"
    run_id: str | None = None
    id: str | None = None
    resolved_model: str | None = None
    input_hash: str | None = None
    upstream_revision: str | None = None
    prompt_version: str | None = None
    applicable_count: int | None = None
    completed_count: int | None = None
    failed_count: int | None = None
    error_message: str | None = None
    result_summary: str | None = None
    started_at: str | None = None
    completed_at: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    recovery_count: int = 0
    last_recovery_reason: str | None = None
    retry_not_before: str | None = None
    lock_owner: str | None = None
    heartbeat_at: str | None = None
    checkpoint_seal: str | None = None
    checkpoint_pointer: str | None = None  # object storage: the published manifest
    journal_lineage: str | None = None  # whose paid replies a claim takes back

    def __post_init__(self) -> None:
        # Built by hand (tests, a few callers): the same status and count the store's
        # builders give, so ``row.status is StepStatus.RUNNING`` holds for text "running".
        # The bulk builders fill ``__dict__`` directly and never come here.
        object.__setattr__(self, "status", parse_status(self.status))
        object.__setattr__(self, "recovery_count", _count(self.recovery_count))

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "LedgerRow":
        """Build from a database row (or any mapping of column -> value); unknown keys are
        ignored, missing ones take their defaults.

        A cold sensor tick builds one per ledger row (100,000s): the instance dict is filled
        in one go instead of through the frozen ``__init__`` (one ``__setattr__`` per field).
        """
        values = dict(_DEFAULTS)
        if row.keys() <= _FIELD_SET:
            values.update(row)
        else:
            values.update((k, v) for k, v in row.items() if k in _FIELD_SET)
        values["status"] = parse_status(values["status"] if "status" in row else None)
        values["recovery_count"] = _count(values["recovery_count"])
        made = object.__new__(cls)
        made.__dict__.update(values)
        return made

    @classmethod
    def builder(cls, columns: Sequence[str]) -> Callable[[Sequence[Any]], "LedgerRow"]:
        """A builder of rows fetched as tuples of ``columns`` (a bulk read's result).

        The same row as :meth:`from_row` of ``dict(zip(columns, values))``, without that dict
        and the defaults' copy per row: the columns are looked at once per query, not once
        per row (a cold sensor tick reads every row of the ledger).
        """
        names = tuple(columns)
        if not set(names) <= _FIELD_SET:
            return lambda values: cls.from_row(dict(zip(names, values, strict=True)))
        missing = {k: v for k, v in _DEFAULTS.items() if k not in names}
        has_status = "status" in names

        def build(values: Sequence[Any]) -> "LedgerRow":
            made = object.__new__(cls)
            state = made.__dict__
            state.update(missing)
            state.update(zip(names, values, strict=True))
            state["status"] = parse_status(state["status"] if has_status else None)
            state["recovery_count"] = _count(state["recovery_count"])
            return made

        return build

    @property
    def is_running(self) -> bool:
        return self.status is StepStatus.RUNNING


_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(LedgerRow))
_FIELD_SET = frozenset(_FIELDS)
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(LedgerRow)}
