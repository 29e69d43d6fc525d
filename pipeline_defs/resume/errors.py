"""One typed error for the whole project: a stable ``code``, a message, an HTTP-like status."""

from collections.abc import Mapping
from typing import Any

# Stable codes and their HTTP-like status. 409 = conflict with another owner or a block.
STATUS_BY_CODE: dict[str, int] = {
    "step.already_running": 409,
    "step.resume_blocked": 409,
    "step.ownership_lost": 409,
    "step.recovery_exhausted": 409,
    "step.gate_blocked": 409,
    "step.verify_crashed": 500,
    "step.execute_failed": 500,
    "step.victim_running": 409,
    "step.victim_not_settled": 409,
    "step.mutation_rejected": 422,
    "step.provider_outside_run": 500,
    "io.integrity_violation": 422,
    "io.checkpoint_missing": 404,
    "checkpoint.invalid": 422,  # a checkpoint.json field of the wrong JSON shape
    # A symlink where a file or directory of ours should be (SPEC §11): a conflict with
    # whoever planted it, resolved by hand; the link is never followed nor removed.
    "checkpoint.symlink": 409,
    "settings.invalid": 400,
    "input.invalid_id": 400,
    "input.invalid": 400,
    "config.invalid": 400,
    # The storage under the data root or the ledger refused a write: no step can fix that,
    # an operator must (free space, remount read-write, fix permissions).
    "storage.full": 507,
    "storage.read_only": 503,
    "storage.permission_denied": 503,
    # An exception nobody typed (a bug or an unforeseen fault): kept with its type and text.
    "internal": 500,
}


class PipelineError(Exception):
    """A failure the operator can act on: ``code`` is stable, ``message`` names the culprit."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        origin: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.status = status if status is not None else STATUS_BY_CODE.get(code, 400)
        self.origin = origin
        self.details = dict(details or {})
        super().__init__(f"[{code}] {message}")

    def as_metadata(self) -> dict[str, str]:
        """Flat text view for Dagster metadata and audit rows."""
        out = {
            "error/code": self.code,
            "error/message": self.message,
            "error/status": str(self.status),
        }
        if self.origin:
            out["error/origin"] = self.origin
        return out
