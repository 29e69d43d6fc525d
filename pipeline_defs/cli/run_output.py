"""How a run is shown: a live progress line per step, the per-step table, and the failure
the command exits with."""

from typing import Any

import click

from pipeline_defs.cli.render import clip, emit_json, render_table, seconds, terminal_width
from pipeline_defs.cli.shared import CommandFailed, error_payload
from pipeline_defs.operations.run_report import Progress, RunReport
from pipeline_defs.resume.errors import ErrorCode, PipelineError


def run_failure(report: RunReport) -> PipelineError:
    failed = next((s for s in report.steps if s.outcome == "failed"), None)
    waiting = next((s for s in report.steps if s.outcome == "waiting"), None)
    if failed is None and waiting is not None:
        return PipelineError(
            ErrorCode.STEP_GATE_BLOCKED, f"{waiting.step}: {waiting.error} ({report.partition})"
        )
    if failed is None and report.error is not None:
        return PipelineError(
            report.error_code or ErrorCode.LAUNCH_RUN_FAILED,
            f"{clip(report.error, 2000)} (run {report.run_id} of {report.partition})",
        )
    if failed is None:
        return PipelineError(
            ErrorCode.LAUNCH_RUN_FAILED,
            f"run {report.run_id} of {report.partition} ended {report.dagster_status}",
        )
    # The way out, unless the failure already names it (an exhausted recovery does).
    known = failed.next_step is None or failed.next_step in (failed.error or "")
    way_out = "" if known else f"; next: {failed.next_step}"
    return PipelineError(
        failed.error_code or ErrorCode.LAUNCH_RUN_FAILED,
        # the cause first: it is what the operator acts on; the run is for looking it up
        f"{failed.step} failed: {clip(failed.error, 600)}{way_out} "
        f"(run {report.run_id} of {report.partition})",
    )


def run_table(report: RunReport) -> str:
    return render_table(
        ["step", "decision", "status", "calls this run", "duration", "note"],
        [
            (
                s.step,
                s.decision,
                s.status,
                s.provider_calls,
                seconds(s.duration_seconds),
                f"[{s.error_code}] {s.error}" if s.error_code else s.error,
            )
            for s in report.steps
        ],
        terminal_width(),
    )


def progress_line(progress: Progress, prefix: str = "") -> str:
    mark = "ok  " if progress.ok else "FAIL"
    calls = "-" if progress.provider_calls is None else str(progress.provider_calls)
    took = seconds(progress.duration_seconds) or "-"
    code = f"[{progress.error_code}] " if progress.error_code else ""
    detail = (
        f"{progress.decision or '-':<22} calls this run={calls:<4} {took}"
        if progress.ok
        else f"{code}{progress.error}"  # whole: it may be the only place the cause shows
    )
    return f"  {prefix}{mark} {progress.step:<22} {detail}"


def finish_run(report: RunReport, as_json: bool, command: str, **extra: Any) -> None:
    """Print a run's report (table or JSON); a failed run exits 1 naming the failed step."""
    if as_json:
        payload = {"ok": report.success, "command": command, **report.as_dict(), **extra}
        if not report.success:
            payload["error"] = error_payload(run_failure(report))
        emit_json(payload)
    else:
        click.echo(f"run {report.run_id} ({report.partition}, launch path {report.launch_path})")
        click.echo(run_table(report))
        click.echo(f"provider calls this run: {report.provider_calls}")
    if not report.success:
        raise CommandFailed(run_failure(report))
