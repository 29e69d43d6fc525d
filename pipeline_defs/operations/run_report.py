"""What a run did, per step: its events folded into progress records and, with the
ledger's audit and cost rows, into a :class:`RunReport`."""

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import dagster as dg

from pipeline_defs.operations.operator_words import DECISION_ACTIONS, shown_action
from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.causes import root_cause_of_text
from pipeline_defs.resume.errors import InternalError, PipelineError, error_class_names
from pipeline_defs.resume.partition import Episode


@dataclass
class StepReport:
    """One step of one run, as the ledger and the run's events tell it."""

    step: str
    # materialized / failed / not_run / waiting (left out: upstream blocked) / unfinished
    # (judged by the run, its end never reported: the process running it was lost)
    outcome: str
    decision: str | None = None
    status: str = "none"
    provider_calls: int = 0
    duration_seconds: float | None = None
    error_code: str | None = None
    error: str | None = None
    # A blocked step's way out, as ``status``/``decide`` print it (the command that fixes it).
    next_step: str | None = None


@dataclass
class RunReport:
    run_id: str
    partition: str
    success: bool
    launch_path: str
    steps: list[StepReport] = field(default_factory=list)
    dagster_status: str | None = None
    # The run's own failure, when it failed outside any step (its executor: a queue no worker
    # consumes, a worker of another instance): its root cause, typed.
    error: str | None = None
    error_code: str | None = None

    @property
    def provider_calls(self) -> int:
        return sum(s.provider_calls for s in self.steps)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "provider_calls": self.provider_calls}


@dataclass(frozen=True)
class Progress:
    """A step finished inside a running run (for live display)."""

    step: str
    ok: bool
    decision: str | None
    provider_calls: int | None
    duration_seconds: float | None
    error: str | None = None
    error_code: str | None = None


def _metadata_value(entry: Any) -> Any:
    return getattr(entry, "value", entry)


def failure_info(event: dg.DagsterEvent) -> tuple[str | None, str]:
    """Code and one-line message of a step failure, naming its root cause.

    A typed failure (``dg.Failure`` from the asset or the IO manager) carries both in its
    metadata. Anything else reaches the event log as Dagster's wrapper ("Error occurred
    while executing op ...") with the real error as its cause: that cause is reported.
    """
    data = event.step_failure_data
    metadata = (data.user_failure_data.metadata if data and data.user_failure_data else {}) or {}
    code = _metadata_value(metadata.get("error/code")) if metadata else None
    message = _metadata_value(metadata.get("error/message")) if metadata else None
    if message:
        return (str(code) if code else None), str(message)
    if data is None or data.error is None:
        return None, "failed"
    cause = _root_cause_of(data.error)
    return cause.code, cause.message


def _root_cause_of(error: Any) -> PipelineError:
    """The typed cause of a serialized error (``SerializableErrorInfo``): Dagster's wrappers
    are skipped, a storage fault anywhere in the chain wins, else the first error raised
    outside Dagster keeps its type and message."""
    chain: list[Any] = []
    current = error
    while current is not None and len(chain) < 20:  # a bound, not a cycle guard: it is data
        chain.append(current)
        current = current.cause or current.context
    own = [e for e in chain if not str(e.cls_name or "").startswith("Dagster")] or chain
    causes = [root_cause_of_text(e.message) for e in own]
    return next((c for c in causes if not isinstance(c, InternalError)), causes[0])


# A typed error as Dagster serialized it: ``module.PipelineError: [code] message``, or a
# subclass of it by its name (``module.BudgetExhausted: [budget.exhausted] ...``).
_TYPED_TEXT = re.compile(r"^(?:[\w.]*\.)?(\w+): \[([a-z0-9_.]+)\] (.*)$", re.DOTALL)


def typed_error_text(text: str) -> tuple[str, str] | None:
    """Code and message of a ``PipelineError`` (or a subclass) as Dagster serialized it;
    None for any other error's text."""
    typed = _TYPED_TEXT.match(text.strip())
    if typed is None or typed.group(1) not in error_class_names():
        return None
    return typed.group(2), typed.group(3).strip()


def run_failure_cause(ws: Workspace, run_id: str) -> tuple[str, str] | None:
    """Code and message of the run's own failure (its executor's error), if it has one:
    a typed error in its chain as it is, else its root cause."""
    instance = ws.instance(required=False)
    if instance is None:
        return None
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE):
        data = entry.dagster_event.job_failure_data if entry.dagster_event else None
        if data is None or data.error is None:
            continue
        current: Any = data.error
        depth = 0
        while current is not None and depth < 20:  # a bound: it is data
            typed = typed_error_text(str(current.message or ""))
            if typed is not None:
                return typed
            current, depth = current.cause or current.context, depth + 1
        cause = _root_cause_of(data.error)
        return cause.code, cause.message
    return None


class Timeline:
    """Folds a run's events into per-step progress records."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.materialized: dict[str, Mapping[str, Any]] = {}
        self.finished: dict[str, Progress] = {}

    def feed(self, event: dg.DagsterEvent, timestamp: float) -> Progress | None:
        step = event.step_key
        if step is None:
            return None
        kind = event.event_type
        if kind == dg.DagsterEventType.STEP_START:
            self.started[step] = timestamp
        elif kind == dg.DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.step_materialization_data.materialization
            self.materialized[step] = {
                k: _metadata_value(v) for k, v in (materialization.metadata or {}).items()
            }
        elif kind in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE):
            began = self.started.get(step)
            duration = round(timestamp - began, 3) if began is not None else None
            ok = kind == dg.DagsterEventType.STEP_SUCCESS
            meta = self.materialized.get(step, {})
            code, error = (None, None) if ok else failure_info(event)
            calls = meta.get("resume/provider_calls")
            progress = Progress(
                step=step,
                ok=ok,
                decision=meta.get("resume/decision"),
                provider_calls=int(calls) if calls is not None else None,
                duration_seconds=duration,
                error=error,
                error_code=code,
            )
            self.finished[step] = progress
            return progress
        return None


WATCHED = {
    dg.DagsterEventType.STEP_START,
    dg.DagsterEventType.ASSET_MATERIALIZATION,
    dg.DagsterEventType.STEP_SUCCESS,
    dg.DagsterEventType.STEP_FAILURE,
}


# A run that ended so: a step it judged whose end never came back ran on a process that
# was lost (a fleet worker's pool process killed), not "not run".
ENDED_UNSUCCESSFULLY = ("FAILURE", "CANCELED")


def _owned_by(run_id: str) -> Callable[[str | None], bool]:
    prefix = f"{run_id}:"
    return lambda owner: str(owner or "").startswith(prefix)


def summarize_run(
    ws: Workspace,
    run_id: str,
    partition_key: str,
    step_ids: Sequence[str],
    timeline: Timeline,
    *,
    success: bool,
    launch_path: str,
    dagster_status: str | None = None,
) -> RunReport:
    """Per step: decision and claim from the audit rows of this run, status from the ledger,
    provider calls from the cost ledger, duration from the run's events."""
    episode = Episode.parse(partition_key)
    mine = _owned_by(run_id)
    rows = ws.ledger.get_many(episodes=[episode], step_ids=list(step_ids))
    report = RunReport(run_id, partition_key, success, launch_path, dagster_status=dagster_status)
    if not success:
        cause = run_failure_cause(ws, run_id)
        if cause is not None:
            report.error_code, report.error = cause
    for step_id in step_ids:
        key = episode.step(step_id)
        audit = [t for t in ws.ledger.transitions(key) if mine(t.run_id)]
        decided = next((t for t in audit if t.action in DECISION_ACTIONS), None)
        decision = shown_action(str(decided.action), decided.reason) if decided else None
        progress = timeline.finished.get(step_id)
        row = rows.get(key)
        if progress is not None:
            outcome = "materialized" if progress.ok else "failed"
        elif decided is not None and dagster_status in ENDED_UNSUCCESSFULLY:
            outcome = "unfinished"  # judged in the run, which ended without the step's end
        else:
            outcome = "not_run"
        step = StepReport(
            step=step_id,
            outcome=outcome,
            decision=decision or (progress.decision if progress else None),
            status=str(row.status) if row else "none",
            provider_calls=sum(1 for c in ws.ledger.provider_calls(key) if mine(c.get("run_id"))),
            duration_seconds=progress.duration_seconds if progress else None,
        )
        if progress is not None and not progress.ok:
            step.error, step.error_code = progress.error, progress.error_code
        elif outcome == "unfinished":  # it may have paid for calls and hold its row running
            ended = (
                f"the run failed ({report.error_code}, below)"
                if report.error
                else f"the run ended {dagster_status}"
            )
            step.error = f"started, its end never reported (its process was lost): {ended}"
        elif progress is None and report.error is not None:
            step.error = f"not run: the run failed ({report.error_code}, below)"
        elif progress is None:
            step.error = "not run: an upstream step in this run did not materialize"
        report.steps.append(step)
    return report
