"""Commands on published checkpoints: ``accept`` a hand edit, ``seal`` the completed rows a
ledger from before seals left unsealed, ``sheet`` (an episode as one HTML page), ``gc`` of
unreferenced attempts, ``storage migrate`` to object storage."""

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from pipeline_defs.cli.app import checked_workspace, main
from pipeline_defs.cli.options import partition_option, partitions_filter
from pipeline_defs.cli.shared import operation
from pipeline_defs.operations import accept_command as accepting
from pipeline_defs.operations import garbage, sealing, storage_migrate
from pipeline_defs.operations import sheet as sheets


@main.command("accept")
@partition_option
@click.option("--step", "step_id", required=True, help="The step whose checkpoint was edited.")
@operation("accept")
def accept(*, partition_key: str, step_id: str, as_json: bool) -> dict[str, Any] | None:
    """Keep a hand edit of a checkpoint: the step re-derives what it can (an edited prompt's
    hash), validates and verifies it, and publishes it under the row lock (archived, sealed,
    audited as manual). No model call; downstream steps judge themselves next. An edit the
    step cannot make valid is refused, naming the field, and nothing changes."""
    ws = checked_workspace()
    (episode,) = ws.require_partitions([partition_key])
    report = accepting.accept(ws, episode, step_id)
    if as_json:
        return report.as_dict()
    if not report.accepted:
        click.echo(f"{partition_key} {step_id}: nothing to accept ({report.note})")
        return None
    click.echo(f"{partition_key} {step_id}: hand edit accepted (no model call)")
    click.echo(f"    changed: {', '.join(report.changed)}")
    if report.archived:
        click.echo(f"    the edited file as it was: {report.archived}")
    if report.downstream:
        click.echo(f"    downstream judges itself at its next run: {', '.join(report.downstream)}")
    return None


@main.command("seal")
@partitions_filter
@operation("seal")
def seal(*, partitions: tuple[str, ...], as_json: bool) -> dict[str, Any] | None:
    """Seal the completed rows that carry no seal (a ledger from before seals), so the
    resume sensor judges them with a few stat calls instead of the long way. Each is
    verified as a run verifies it; only a clean one is sealed, compare-and-set on the row
    as it was read. No status changes, no checkpoint is written, running rows are left."""
    ws = checked_workspace()
    report = sealing.seal_completed(ws, partitions)
    if as_json:
        return report.as_dict()
    counts = report.as_dict()["counts"]
    click.echo(
        f"{counts['sealed']} sealed, {counts['already_sealed']} already sealed, "
        f"{counts['not_clean']} not clean (left for the sensor and the runs), "
        f"{counts['changed']} changed meanwhile (left alone)"
    )
    for key, why in report.not_clean.items():
        click.echo(f"    not sealed {key}: {why}")
    for key in report.changed:
        click.echo(f"    changed meanwhile {key}: run again to seal it")
    return None


@main.command("sheet")
@partition_option
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The HTML file to write (default: storyboard-PROJECT-EPISODE.html here).",
)
@operation("sheet")
def sheet(*, partition_key: str, out: Path | None, as_json: bool) -> dict[str, Any] | None:
    """Write one self-contained HTML page of an episode's storyboard, in story order: each
    scene with its shots (thumbnail, prompt, characters), then the characters' reference
    sheets. No model call; nothing is written but the page."""
    ws = checked_workspace()
    (episode,) = ws.require_partitions([partition_key], registration_required=False)
    report = sheets.build_sheet(ws, episode)
    target = out or Path(f"storyboard-{episode.project_id}-{episode.episode_id}.html")
    sheets.write_sheet(report, target)
    if as_json:
        return {"out": str(target), **report.as_dict()}
    for line in sheets.sheet_summary_lines(report, target):
        click.echo(line)
    return None


MAX_GRACE_HOURS = 24 * 365 * 100


def _finite_hours(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    """A grace period is a real span of hours: ``nan``, ``inf`` and anything past
    ``MAX_GRACE_HOURS`` (a century; ``timedelta`` ends at 2.7 million years) are refused."""
    if not math.isfinite(value) or value > MAX_GRACE_HOURS:
        raise click.BadParameter(
            f"{value!r} is no grace period: give a number of hours from 0 to {MAX_GRACE_HOURS}"
        )
    return value


@main.command("gc")
@click.option(
    "--grace-hours",
    type=click.FloatRange(min=0),
    callback=_finite_hours,
    default=garbage.DEFAULT_GRACE.total_seconds() / 3600,
    show_default=True,
    help="Keep any attempt with an object younger than this (at least 1: an attempt is "
    "uploaded before the commit that names it).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@operation("gc")
def gc(*, grace_hours: float, dry_run: bool, as_json: bool) -> dict[str, Any] | None:
    """Delete attempt prefixes on object storage that no ledger row names (current or
    archived pointers), and journal entries of paid replies no row can take back any more,
    once older than the grace period."""
    ws = checked_workspace()
    report = garbage.collect_garbage(ws, grace=timedelta(hours=grace_hours), dry_run=dry_run)
    if as_json:
        return report.as_dict()
    done, journal = report.collection, report.journal
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{report.storage}: {verb} {len(done.deleted_prefixes)} attempt(s), "
        f"{done.deleted_objects} object(s); kept {done.kept_referenced} named, "
        f"{done.kept_young} younger than {grace_hours:g} h"
    )
    click.echo(
        f"journal of paid replies: {verb} {journal.deleted_entries} entr(ies) no row can take "
        f"back; kept {journal.kept_in_use} in use, {journal.kept_young} younger than "
        f"{grace_hours:g} h"
    )
    for prefix in done.deleted_prefixes:
        click.echo(f"    {prefix}")
    return None


@main.group("storage")
def storage_group() -> None:
    """Where checkpoints are published (PIPELINE_STORAGE_URL)."""


@storage_group.command("migrate")
@click.option("--to", "url", required=True, help="s3://bucket/prefix, gs://…, az://…")
@operation("storage migrate")
def storage_migrate_command(*, url: str, as_json: bool) -> dict[str, Any] | None:
    """Copy every settled checkpoint of the local home into object storage, verified, and
    point its ledger row at the copy. Changes nothing local; run it again to finish; then
    set PIPELINE_STORAGE_URL everywhere."""
    ws = checked_workspace()
    report = storage_migrate.migrate_to(ws, url)
    if as_json:
        return report.as_dict()
    click.echo(
        f"{report.storage}: {len(report.migrated)} checkpoint(s) migrated ({report.objects} "
        f"objects, {report.bytes} bytes), {len(report.already)} already there, "
        f"{report.pending_edits} write-ahead edit(s) copied"
    )
    for key, why in report.skipped.items():
        click.echo(f"    skipped {key}: {why}")
    if not report.skipped:
        click.echo(f"next: set PIPELINE_STORAGE_URL={report.storage} on every process")
    return None
