"""Commands that launch runs: ``add-episode`` (registers what runs), ``materialize``,
``force``, ``redraw`` and ``demo``."""

from pathlib import Path
from typing import Any

import click

from pipeline_defs.cli.app import checked_workspace, main
from pipeline_defs.cli.options import partition_option, submission_options
from pipeline_defs.cli.render import emit_json
from pipeline_defs.cli.run_output import finish_run, progress_line, run_failure, run_table
from pipeline_defs.cli.shared import CommandFailed, error_payload, operation
from pipeline_defs.operations import demo as demos
from pipeline_defs.operations.episodes import add_episode as register_episode
from pipeline_defs.operations.force_command import force_step, invalidated_by
from pipeline_defs.operations.redraw_command import redraw_step
from pipeline_defs.operations.run_report import Progress
from pipeline_defs.operations.runs import run_assets


@main.command("add-episode")
@click.option("--project", "project_id", required=True, help="Project id ([A-Za-z0-9_-]{1,64}).")
@click.option("--episode", "episode_id", required=True, help="Episode id ([A-Za-z0-9_-]{1,64}).")
@click.option(
    "--story", "story", required=True, type=click.Path(path_type=Path), help="Story file."
)
@click.option("--replace", is_flag=True, help="Overwrite a different story already in place.")
@operation("add-episode")
def add_episode(
    *, project_id: str, episode_id: str, story: Path, replace: bool, as_json: bool
) -> dict[str, Any] | None:
    """Copy a story in, create project.yaml if missing, register partition PROJECT/EPISODE."""
    ws = checked_workspace()
    result = register_episode(ws, project_id, episode_id, story, replace=replace)
    if not as_json:
        click.echo(
            f"episode {result['partition']}: story {result['story_state']} at {result['story']}"
        )
        click.echo(f"project config {result['project_config_state']}: {result['project_config']}")
        click.echo(f"partition {result['partition']}: {result['partition_registered']}")
        cap = f"cap {result['max_calls_per_episode']} per episode, max_calls_per_episode"
        if result["estimate"] is None:
            click.echo(f"estimated provider calls: none (not the storyboard's steps; {cap})")
        else:
            click.echo(
                f"estimated provider calls: {result['estimated_calls']} for "
                f"{result['estimate']['scenes']} scenes ({cap})"
            )
        cost = result["estimated_cost"]
        if cost is not None:
            budget = result["max_cost_per_episode"]
            limit = "" if budget is None else f" (budget {budget} per episode)"
            click.echo(
                f"estimated cost: at most {cost['total']} ({cost['text_calls']} text calls at "
                f"their worst case, {cost['image_calls']} pictures){limit}"
            )
        for warning in result["warnings"]:
            click.echo(f"warning: {warning}", err=True)
    return result


@main.command()
@partition_option
@click.option("--step", "step_ids", multiple=True, help="Step(s) to launch (default: all).")
@operation("materialize")
def materialize(
    *, partition_key: str, step_ids: tuple[str, ...], as_json: bool
) -> dict[str, Any] | None:
    """Launch a resume run of steps of one partition (judged like any UI launch)."""
    ws = checked_workspace()
    progress = None if as_json else (lambda p: click.echo(progress_line(p)))
    report = run_assets(ws, partition_key, list(step_ids) or None, progress=progress)
    finish_run(report, as_json, "materialize")
    return None


@main.command()
@partition_option
@click.option("--step", "step_id", required=True, help="The one step to rebuild.")
@submission_options
@operation("force")
def force(
    *,
    partition_key: str,
    step_id: str,
    graphql_url: str | None,
    location: str | None,
    wait: bool,
    as_json: bool,
) -> dict[str, Any] | None:
    """Explicit force of one step (tag resume/mode=force): cleans it, invalidates downstream."""
    ws = checked_workspace()
    report = force_step(
        ws, partition_key, step_id, graphql_url=graphql_url, location=location, wait=wait
    )
    if graphql_url and not wait:
        payload = {"run_id": report.run_id, "partition": partition_key, "step": step_id}
        if not as_json:
            click.echo(f"submitted run {report.run_id} (force {partition_key}:{step_id})")
        return payload
    invalidated = invalidated_by(ws, report.run_id, partition_key, step_id)
    if not as_json and invalidated:
        click.echo(f"invalidated downstream: {', '.join(invalidated)}")
    finish_run(report, as_json, "force", invalidated=invalidated)
    return None


@main.command()
@partition_option
@click.option("--step", "step_id", required=True, help="The image step to redraw in.")
@click.option(
    "--item",
    "items",
    multiple=True,
    required=True,
    help="Item id as the step's checkpoint lists it (C01, C03_O01, S1_L0_V0), or 'all'.",
)
@click.option(
    "--with-dependents",
    is_flag=True,
    help="Also redraw the downstream pictures built from these items (same run).",
)
@submission_options
@operation("redraw")
def redraw(
    *,
    partition_key: str,
    step_id: str,
    items: tuple[str, ...],
    with_dependents: bool,
    graphql_url: str | None,
    location: str | None,
    wait: bool,
    as_json: bool,
) -> dict[str, Any] | None:
    """Draw chosen items of one image step again (tag resume/redraw); the old PNGs and
    receipts are archived, every other item is kept as it is."""
    ws = checked_workspace()
    plan, report = redraw_step(
        ws,
        partition_key,
        step_id,
        items,
        with_dependents=with_dependents,
        graphql_url=graphql_url,
        location=location,
        wait=wait,
    )
    if graphql_url and not wait:
        payload = {"run_id": report.run_id, "partition": partition_key, "redraw": plan.as_dict()}
        if not as_json:
            click.echo(f"submitted run {report.run_id} (redraw {partition_key}:{plan.step})")
        return payload
    if not as_json and plan.dependents:
        built = "; ".join(f"{s}: {', '.join(i)}" for s, i in plan.dependents.items())
        verb = "redrawn too" if with_dependents else "kept; add --with-dependents to redraw"
        click.echo(f"built from the redrawn items ({verb}): {built}")
    finish_run(report, as_json, "redraw", redraw=plan.as_dict())
    return None


@main.command()
@click.option("--project", "project_id", default="demo", show_default=True)
@click.option(
    "--stories", "stories_dir", type=click.Path(path_type=Path), help="Folder of *.md stories."
)
@operation("demo")
def demo(*, project_id: str, stories_dir: Path | None, as_json: bool) -> dict[str, Any] | None:
    """Create a sample project with two episodes and materialize everything for both."""
    ws = checked_workspace()

    def progress(partition: str, item: Progress) -> None:
        click.echo(progress_line(item, f"{partition}  "), err=as_json)

    if not as_json:
        published = demos.published_to(ws)
        where = f"; checkpoints and pictures in {published}" if published else ""
        click.echo(f"storyboard demo: project {project_id!r}, data in {ws.home}{where}")
    report = demos.demo(ws, project_id=project_id, stories_dir=stories_dir, progress=progress)
    if as_json:
        payload = {"ok": report.success, "command": "demo", **report.as_dict()}
        if not report.success:
            failed = next(r for r in report.runs if not r.success)
            payload["error"] = error_payload(run_failure(failed))
        emit_json(payload)
    else:
        for run in report.runs:
            click.echo(f"\nepisode {run.partition} (run {run.run_id})")
            click.echo(run_table(run))
            found = report.pictures.get(run.partition)
            if found is None:
                continue
            detail = ", ".join(f"{k}/ {v}" for k, v in found.per_step.items())
            click.echo(f"images: {len(found.files)} PNG under {found.under}/ ({detail or 'none'})")
        click.echo("")
        if report.provider_calls == 0 and report.all_skipped:
            click.echo(
                "0 provider calls: every step was SKIP "
                "(verified checkpoints reused, nothing re-run)"
            )
        else:
            click.echo(f"provider calls this run: {report.provider_calls}")
            click.echo("run `storyboard demo` again: it resumes with zero provider calls")
    if not report.success:
        failed = next(r for r in report.runs if not r.success)
        raise CommandFailed(run_failure(failed))
    return None
