"""Stuck running rows: ``audit-running`` judges each as the sensor does, ``reset-running``
resets one to failed only if it is unchanged."""

from typing import Any

import click

from pipeline_defs.cli.app import checked_workspace, main
from pipeline_defs.cli.options import partition_option
from pipeline_defs.cli.render import clip, render_table, seconds
from pipeline_defs.cli.shared import operation
from pipeline_defs.operations import reset, running_audit
from pipeline_defs.resume.errors import ErrorCode, PipelineError


@main.command("audit-running")
@operation("audit-running")
def audit_running(*, as_json: bool) -> dict[str, Any] | None:
    """Every running ledger row: healthy / lease_expired / dead_owner / future / unparseable /
    NULL started_at (judged as the resume sensor judges it)."""
    ws = checked_workspace()
    rows = running_audit.audit_running(ws)
    counts = {b: sum(1 for r in rows if r.bucket == b) for b in running_audit.RUNNING_BUCKETS}
    if as_json:
        from dataclasses import asdict

        return {
            "running": [asdict(r) for r in rows],
            "counts": counts,
            "running_timeout_seconds": ws.settings.running_timeout_seconds,
        }
    if rows:
        click.echo(
            render_table(
                ["partition", "step", "bucket", "started_at", "elapsed", "run", "dagster", "hint"],
                [
                    (
                        r.partition,
                        r.step,
                        r.bucket,
                        r.started_at,
                        seconds(r.elapsed_seconds),
                        clip(r.run_id, 20),
                        r.dagster_run_status,
                        r.hint,
                    )
                    for r in rows
                ],
            )
        )
    click.echo(
        ("\n" if rows else "")
        + "  ".join(f"{k} {v}" for k, v in counts.items())
        + f"  (running timeout {ws.settings.running_timeout_seconds}s)"
    )
    return {}


@main.command("reset-running")
@partition_option
@click.option("--step", "step_id", required=True)
@click.option("--expected-started-at", help="The started_at text the row must still have.")
@click.option("--null-started-at", is_flag=True, help="Expect started_at to be NULL instead.")
@click.option("--reason", default="reset by an operator (storyboard reset-running)")
@operation("reset-running")
def reset_running(
    *,
    partition_key: str,
    step_id: str,
    expected_started_at: str | None,
    null_started_at: bool,
    reason: str,
    as_json: bool,
) -> dict[str, Any] | None:
    """Reset a stuck running row to failed, only if it still has the expected started_at."""
    if (expected_started_at is None) == (not null_started_at):
        raise PipelineError(
            ErrorCode.INPUT_INVALID,
            "give exactly one of --expected-started-at T or --null-started-at",
        )
    result = reset.reset_running(
        checked_workspace(),
        partition_key,
        step_id,
        None if null_started_at else expected_started_at,
        reason,
    )
    if not as_json:
        click.echo(f"{partition_key}:{step_id}: running → failed ({reason})")
    return result
