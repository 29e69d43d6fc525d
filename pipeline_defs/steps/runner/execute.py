"""Execute a claimed step: its body with metered providers, a mutator's edits prepared,
the envelope built and validated, then exit-verified. Publishes nothing: the runner
publishes the :class:`Execution` under its lease."""

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline_defs.project import money_budget, project_config_path
from pipeline_defs.resume.completion import CompletionReport
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.context import ProviderMeter, StepContext
from pipeline_defs.steps.faults import crash_point
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.lease import Lease
from pipeline_defs.steps.mutations import PreparedEdit, intents_data
from pipeline_defs.steps.mutator_edits import MutatorEdits
from pipeline_defs.steps.rate_wait import LedgerThrottle, limits_of
from pipeline_defs.steps.runner.exit_verify import exit_verify
from pipeline_defs.steps.runner.result_envelope import envelope
from pipeline_defs.steps.runner.run_info import RunInfo
from pipeline_defs.steps.runner.writers import Writers
from resources.checkpoints.envelope import Checkpoint
from resources.providers.base import Model


@dataclass(frozen=True)
class Execution:
    """An executed, verified result, ready to publish."""

    status: StepStatus
    checkpoint: Checkpoint
    summary: str
    ctx: StepContext
    meter: ProviderMeter
    counts: Mapping[str, int]
    report: CompletionReport | None
    reads: tuple[Path, ...] | None  # the seal's reads: a clean completed result only
    edits: tuple[PreparedEdit, ...]  # a mutator's edits, written ahead before the publish
    metadata: Mapping[str, Any]


def execute(
    judge: StepJudge,
    writers: Writers,
    mutations: MutatorEdits,
    key: StepKey,
    run: RunInfo,
    inputs: Mapping[str, Checkpoint | None],
    *,
    lease: Lease,
    models: Mapping[str, Model],
) -> Execution:
    step, clock = judge.step, judge.clock
    # (1) execute with metered providers: the models of the project, resolved now
    lineage = writers.ledger.journal_lineage(key, run.run_id)
    journal = None
    if lineage is not None:  # None: the claim was lost already; the guard says so below
        journal = writers.checkpoints.journal(key, lineage, judge.log)
    project = judge.project(key)
    throttle = LedgerThrottle(
        writers.ledger.rate_limits,
        key,
        run.run_id,
        limits_of(project.provider),
        guard=lease.check,
    )
    meter = ProviderMeter(
        writers.ledger,
        key,
        run.run_id,
        models,
        guard=lease.check,
        cap=judge.call_cap(key, project),
        claimed=True,
        journal=journal,
        # prices and money budgets (docs/DESIGN.md#money-budgets)
        money=money_budget(
            project, str(project_config_path(writers.checkpoints.home, key.project_id))
        ),
        throttle=throttle,
    )
    ctx = writers.context(judge, key, run_id=run.run_id, meter=meter, redraw=run.redraw_items)
    started = clock()
    result = step.execute(ctx, {dep: cp for dep, cp in inputs.items() if cp is not None})
    crash_point("executed", key.step_id)
    # (1b) a mutator's edits: prepared and verified now, written ahead before it publishes
    edits: list[PreparedEdit] = []
    if step.modifies_checkpoints:
        edits = mutations.prepare(key, run.run_id, result.mutations, inputs)
        result = dataclasses.replace(
            result, data=intents_data(result.data, [e.intent for e in edits])
        )
    # (2) final status from the counts
    checkpoint = envelope(step, key, result, result.status, run, ctx.project, clock, started)
    step.validate_data(checkpoint.data, source=str(writers.checkpoints.path_for(key)))
    # (3) exit verify of what we are about to publish
    verified = exit_verify(judge, key, ctx, result.status, checkpoint)
    counts = {
        "applicable_count": result.applicable_count,
        "completed_count": result.completed,
        "failed_count": result.failed_count,
    }
    return Execution(
        status=verified.status,
        checkpoint=verified.checkpoint,
        summary=result.summary,
        ctx=ctx,
        meter=meter,
        counts=counts,
        report=verified.report,
        reads=verified.reads,
        edits=tuple(edits),
        metadata=dict(result.metadata),
    )
