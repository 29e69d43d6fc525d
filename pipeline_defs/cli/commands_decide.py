"""``storyboard decide``: shadow mode, what the resume sensor would do now (writes nothing)."""

from collections.abc import Mapping, Sequence
from typing import Any

import click

from pipeline_defs.cli.app import checked_workspace, main, report_invalid_partitions
from pipeline_defs.cli.options import partitions_filter
from pipeline_defs.cli.render import SaidOnce, advice, table_lines, terminal_width
from pipeline_defs.cli.shared import operation
from pipeline_defs.operations.shadow_decide import shadow_decisions, verdict_counts
from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.partition import Episode
from pipeline_defs.steps.redraw import outdated_items


@main.command()
@partitions_filter
@click.option("--all", "show_all", is_flag=True, help="Also list steps the sensor would skip.")
@operation("decide")
def decide(*, partitions: tuple[str, ...], show_all: bool, as_json: bool) -> dict[str, Any] | None:
    """Shadow mode: what the resume sensor would do now. Writes nothing."""
    ws = checked_workspace()
    decisions = shadow_decisions(ws, partitions)
    invalid = report_invalid_partitions(ws)
    counts = verdict_counts(decisions)
    outdated = _outdated_pictures(ws, decisions)
    if as_json:
        return {
            "decisions": decisions,
            "counts": counts,
            "invalid_partitions": invalid,
            "outdated": outdated,
        }
    width = terminal_width()
    shown = [d for d in decisions if show_all or d["verdict"] != "skip"]
    rows = []
    said = SaidOnce()
    firsts = []
    for d in shown:
        # waiting / deferred say why in their detail; a block says what to do below its row
        waits = d["verdict"] not in ("blocked", "launch", "skip", "not_applicable")
        said_first = d["reason"].startswith(d["detail"])  # a blocked upstream leads
        text = f"{d['reason']} — {d['detail']}" if waits and not said_first else d["reason"]
        first = (
            said.earlier(f"{d['partition']} {d['step']}", text, d["what_to_do"])
            if d["verdict"] == "blocked"
            else None
        )
        firsts.append(first)
        shown_text = f"same as {first} (above)" if first else text
        rows.append((d["partition"], d["step"], d["verdict"], d["action"], d["origin"], shown_text))
    if rows:
        headers = ["partition", "step", "would", "action", "origin", "reason"]
        lines, groups = table_lines(headers, rows, width)
        for d, group, first in zip(shown, groups, firsts, strict=True):
            lines += group
            if d["what_to_do"] and first is None:
                advice(lines, d["what_to_do"], width)
        click.echo("\n".join(lines))
    for entry in outdated:
        click.echo(
            f"{entry['partition']} {entry['step']} {entry['item']}: built from a picture "
            f"redrawn since ({', '.join(entry['built_from'])}); kept until redrawn:"
        )
        click.echo(
            f"    storyboard redraw --partition {entry['partition']} --step {entry['step']} "
            f"--item {entry['item']}"
        )
    summary = "  ".join(f"{k} {v}" for k, v in counts.items()) or "nothing to evaluate"
    click.echo(f"{chr(10) if shown else ''}shadow decision (no writes): {summary}")
    return {}


def _outdated_pictures(
    ws: Workspace, decisions: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Items built from an upstream picture that has been redrawn since (never redrawn by
    the sensor: reported here, redrawn by ``storyboard redraw``)."""
    out: list[dict[str, Any]] = []
    for partition in dict.fromkeys(str(d["partition"]) for d in decisions):
        episode = Episode.parse(partition)
        for step, items in outdated_items(ws.steps, ws.checkpoints.load, episode).items():
            out += [
                {"partition": partition, "step": step, "item": item, "built_from": sources}
                for item, sources in items.items()
            ]
    return out
