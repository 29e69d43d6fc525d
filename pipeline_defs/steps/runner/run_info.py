"""Who is running a step (owner token, mode, launch path) and its judgement's history line."""

import dataclasses
import secrets
from dataclasses import dataclass

from pipeline_defs.resume.decision_types import LaunchMode, ResumeDecision
from pipeline_defs.steps.judge import AUTOMATIC_LAUNCH_PATH
from pipeline_defs.steps.redraw import Redraw
from resources.ledger.audit import Audit, AuditAction


@dataclass(frozen=True)
class RunInfo:
    """Who is running: the ledger owner token, the requested mode, the launch path.

    ``run_id`` is the run's token (``<Dagster run id>:<retry>``) until the step is claimed;
    :meth:`claiming` mints the claim's own token from it (docs/DESIGN.md#claim-tokens), and
    every owner check after the claim compares that one.
    """

    run_id: str
    mode: LaunchMode = LaunchMode.RESUME
    launch_path: str = "api"
    redraw: Redraw | None = None  # the request (tags); resolved per step by ``run``
    redraw_items: frozenset[str] = frozenset()  # this step's targets, once resolved

    def claiming(self) -> "RunInfo":
        """This run as the owner of one new claim: its token is the run's plus a nonce of
        its own (``<run id>:<retry>:<nonce>``). A task delivered again in the same run, a
        retry and a re-execution each claim with a token of their own, so a takeover by any
        of them leaves the earlier holder's heartbeat, call records, transitions and publish
        matching no row."""
        return dataclasses.replace(self, run_id=claim_token(self.run_id))

    @property
    def automatic(self) -> bool:
        """Launched by the resume sensor: the only launches whose recoveries are counted
        . An operator's own launch is not an automatic recovery: counting it
         let three operator runs killed in a row exhaust the step against that operator."""
        return self.launch_path == AUTOMATIC_LAUNCH_PATH


_NONCE_BYTES = 6


def claim_token(run_id: str) -> str:
    """A fencing token for one claim by ``run_id``: unique per claim, led by the run's token
    (so ``owner_run_id`` still finds the Dagster run, and history lines still start with it)."""
    return f"{run_id}:{secrets.token_hex(_NONCE_BYTES)}"


def run_token_of(token: str) -> str:
    """The run's token (``<run id>:<retry>``) a claim token was minted from; a token that is
    no claim's (an operator's, a test's, one written before claims had tokens) as it is."""
    head, _, nonce = token.rpartition(":")
    if head and len(nonce) == 2 * _NONCE_BYTES and all(c in "0123456789abcdef" for c in nonce):
        return head
    return token


def audit_line(
    run: RunInfo,
    decision: ResumeDecision,
    *,
    action: AuditAction,
    from_status: str | None,
    to_status: str | None,
    reason: str | None = None,
) -> Audit:
    """A history line of this run's judgement (docs/DESIGN.md#audit)."""
    return Audit(
        action=action,
        from_status=from_status,
        to_status=to_status,
        origin=decision.origin.value if decision.origin else None,
        reason=reason or decision.reason,
        run_id=run.run_id,
        launch_path=run.launch_path,
    )
