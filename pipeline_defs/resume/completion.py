"""Completion reports: what a step's ``verify_completion()`` found, and why (its origin).

The origin decides the judge's action (docs/DESIGN.md#origins), so it is explicit and validated here
instead of being inferred from free text later.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from pipeline_defs.resume.errors import PipelineError


class Origin(StrEnum):
    """Why a step is (in)complete; drives rerun vs block."""

    CLEAN = "clean"
    # A mutator's victim no longer holds the edits it published (changed since it was
    # reviewed, gone or blocked): nothing of the mutator is missing; it reviews again.
    VICTIM_CHANGED = "victim_changed"
    # An input it read changed since (a prompt upstream edited by hand or by a review): what
    # was made from the old input is made again; nothing is missing.
    INPUT_CHANGED = "input_changed"
    ARTIFACT_MISSING = "artifact_missing"
    CONTRACT_DRIFT = "contract_drift"
    INVARIANT_DRIFT = "invariant_drift"
    VERIFY_CRASHED = "verify_crashed"


# Higher wins when several signals occur at once (docs/DESIGN.md#origins).
ORIGIN_PRIORITY: Mapping[Origin, int] = MappingProxyType(
    {
        Origin.CLEAN: 0,
        Origin.VICTIM_CHANGED: 1,
        Origin.INPUT_CHANGED: 2,
        Origin.ARTIFACT_MISSING: 3,
        Origin.INVARIANT_DRIFT: 4,
        Origin.CONTRACT_DRIFT: 5,
        Origin.VERIFY_CRASHED: 6,
    }
)


class Severity(StrEnum):
    """How much is missing: nothing, some items, or the whole output."""

    CLEAN = "clean"
    PARTIAL = "partial"
    MISSING = "missing"


@dataclass(frozen=True)
class CompletionReport:
    """The verdict of ``verify_completion()``; inconsistent verdicts are refused at birth."""

    is_complete: bool
    missing: tuple[str, ...] = ()
    severity: Severity | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    origin: Origin | None = None

    def __post_init__(self) -> None:
        complete = bool(self.is_complete)
        origin = Origin(self.origin) if self.origin is not None else None
        severity = Severity(self.severity) if self.severity is not None else None
        if origin is None:
            origin = Origin.CLEAN if complete else Origin.ARTIFACT_MISSING
        if severity is None:
            severity = Severity.CLEAN if complete else Severity.MISSING
        if complete and origin is not Origin.CLEAN:
            raise ValueError(f"a complete report must have origin 'clean', got {origin.value!r}")
        if not complete and origin is Origin.CLEAN:
            raise ValueError("an incomplete report cannot have origin 'clean'")
        if complete and severity is not Severity.CLEAN:
            raise ValueError(
                f"a complete report must have severity 'clean', got {severity.value!r}"
            )
        if not complete and severity is Severity.CLEAN:
            raise ValueError("an incomplete report cannot have severity 'clean'")
        object.__setattr__(self, "is_complete", complete)
        object.__setattr__(self, "origin", origin)
        object.__setattr__(self, "severity", severity)
        object.__setattr__(self, "missing", tuple(str(m) for m in self.missing))
        object.__setattr__(self, "metadata", dict(self.metadata))

    @classmethod
    def clean(cls, **metadata: Any) -> "CompletionReport":
        """Everything present and consistent."""
        return cls(is_complete=True, metadata=metadata)

    @classmethod
    def incomplete(
        cls,
        origin: Origin,
        missing: tuple[str, ...] | list[str] = (),
        severity: Severity = Severity.MISSING,
        **metadata: Any,
    ) -> "CompletionReport":
        """Something is wrong; ``origin`` says what kind of wrong."""
        return cls(
            is_complete=False,
            missing=tuple(missing),
            severity=severity,
            metadata=metadata,
            origin=origin,
        )


def merge_reports(*reports: CompletionReport) -> CompletionReport:
    """Fold several signals into one verdict: worst origin wins, missing items are unioned."""
    if not reports:
        return CompletionReport.clean()
    origin = max((r.origin or Origin.CLEAN for r in reports), key=ORIGIN_PRIORITY.__getitem__)
    missing = tuple(dict.fromkeys(item for r in reports for item in r.missing))
    metadata: dict[str, Any] = {}
    for r in reports:
        metadata.update(r.metadata)
    if all(r.is_complete for r in reports):
        return CompletionReport(is_complete=True, missing=missing, metadata=metadata)
    if any(r.severity is Severity.MISSING for r in reports):
        severity = Severity.MISSING
    else:
        severity = Severity.PARTIAL
    return CompletionReport(
        is_complete=False, missing=missing, severity=severity, metadata=metadata, origin=origin
    )


def report_from_exception(exc: BaseException) -> CompletionReport:
    """A verifier that raised: typed error = contract drift, anything else = crash."""
    if isinstance(exc, PipelineError):
        return CompletionReport.incomplete(
            Origin.CONTRACT_DRIFT,
            missing=(exc.code,),
            error=exc.message,
            error_code=exc.code,
        )
    return CompletionReport.incomplete(
        Origin.VERIFY_CRASHED,
        error=f"{type(exc).__name__}: {exc}",
    )
