"""``storyboard``: the operator CLI (docs/DESIGN.md#launch-paths). Every command takes ``--json``.

Errors exit non-zero with one line naming the culprit and the typed error code:
``error: [input.invalid_id] invalid project_id '..': ids must match ...``.
"""

import functools
import json
import os
import re
import shutil
import signal
import sys
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from pipeline_defs.operations import accept as accepting
from pipeline_defs.operations import garbage, launch, storage_migrate
from pipeline_defs.operations import inspect as views
from pipeline_defs.operations import sheet as sheets
from pipeline_defs.operations.workspace import (
    DEFS_ENV,
    Workspace,
    load_workspace,
    quiet_dagster_notices,
    safe_url,
)
from pipeline_defs.resume.causes import root_cause
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.partition import Episode
from pipeline_defs.resume.settings import (
    ENV_NAMES,
    EffectiveSettings,
    check_environment,
    check_environment_against_ledger,
    env_ledger_values,
    format_value,
)
from pipeline_defs.steps.redraw import outdated_items
from resources.ledger.store import lock_owner

F = TypeVar("F", bound=Callable[..., Any])
DEBUG_ENV = "STORYBOARD_DEBUG"


# --------------------------------------------------------------------------- output
def render_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], width: int | None = None
) -> str:
    """A plain aligned text table; None shows as '-'.

    With ``width`` the last column (the free text: a reason, a block) is wrapped to fit it,
    never cut; when the other columns leave it too little room, it goes on indented lines
    under its row instead.
    """
    head, groups = table_lines(headers, rows, width)
    return "\n".join([*head, *(line for group in groups for line in group)])


def table_lines(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], width: int | None = None
) -> tuple[list[str], list[list[str]]]:
    """:func:`render_table` as its header lines and, per row, that row's lines."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    if width is None or not headers:
        return _aligned(headers, widths), [[_row(row, widths)] for row in cells]
    fixed = sum(w + 2 for w in widths[:-1])
    room = width - fixed
    groups: list[list[str]] = []
    if room >= MIN_TEXT_WIDTH:
        last = min(widths[-1], room)
        for row in cells:
            lines = _wrap(row[-1], last) or [""]
            groups.append([_row([*row[:-1], lines[0]], [*widths[:-1], last])])
            groups[-1] += [" " * fixed + line for line in lines[1:]]
        return _aligned(headers, [*widths[:-1], last]), groups
    label = f"    {headers[-1]}: "
    for row in cells:
        groups.append([_row(row[:-1], widths[:-1])])
        if row[-1] != "-":
            wrapped = _wrap(row[-1], width - len(label))
            groups[-1] += [
                (label if i == 0 else " " * len(label)) + w for i, w in enumerate(wrapped)
            ]
    return _aligned(headers[:-1], widths[:-1]), groups


MIN_TEXT_WIDTH = 30


def _aligned(headers: Sequence[str], widths: Sequence[int]) -> list[str]:
    return [_row(headers, widths), "  ".join("-" * w for w in widths)]


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    """Wrapped at spaces only: a path or an id in the text stays whole (and copyable)."""
    return textwrap.wrap(
        text,
        max(MIN_TEXT_WIDTH, width),
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def terminal_width() -> int:
    """Columns of the terminal (``COLUMNS`` first); 100 when not attached to one."""
    return shutil.get_terminal_size((100, 24)).columns


# A storyboard command inside an operator hint, e.g. "... (storyboard force --partition p/e
# --step s); ..." or "If not: storyboard reset-running ... --expected-started-at 'T'".
_COMMAND = re.compile(
    r"storyboard [a-z-]+(?: --[a-z-]+(?: (?!--)(?:'[^']*'|\"[^\"]*\"|[^\s;)'\"]+))?)*"
)


def commands_in(hint: str) -> list[str]:
    """The commands a hint tells the operator to run, each whole (to print on its own line)."""
    return _COMMAND.findall(hint or "")


def _advice(lines: list[str], hint: str, width: int, indent: str = "    ") -> None:
    """A hint wrapped to the terminal, then each command in it whole on its own line."""
    lines += _wrap(f"next: {hint}", width - len(indent), indent)
    lines += [f"{indent}  {command}" for command in commands_in(hint)]


def _clip(text: Any, width: int = 60) -> str | None:
    if text is None:
        return None
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _seconds(value: float | None) -> str | None:
    if value is None:
        return None
    return f"{value:.2f}s" if value < 10 else f"{value:.1f}s"


def emit_json(payload: Mapping[str, Any]) -> None:
    click.echo(json.dumps(payload, indent=2, default=str, sort_keys=False))


class CommandFailed(Exception):
    """A command ran but its outcome is a failure (e.g. a run failed): exit 1."""

    def __init__(self, error: PipelineError) -> None:
        super().__init__(str(error))
        self.error = error


def _error_payload(error: PipelineError) -> dict[str, Any]:
    return {
        "code": error.code,
        "message": error.message,
        "status": error.status,
        "origin": error.origin,
    }


def operation(name: str) -> Callable[[F], F]:
    """Common wiring: ``--json``, typed errors → one line on stderr and exit code 1."""

    def wrap(fn: F) -> F:
        @click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
        @functools.wraps(fn)
        def run(*args: Any, as_json: bool, **kwargs: Any) -> None:
            try:
                payload = fn(*args, as_json=as_json, **kwargs)
                if as_json and payload is not None:
                    emit_json({"ok": True, "command": name, **payload})
            except CommandFailed as failed:
                click.echo(f"error: {failed.error}", err=True)
                sys.exit(1)
            except PipelineError as error:
                if as_json:
                    emit_json({"ok": False, "command": name, "error": _error_payload(error)})
                click.echo(f"error: {error}", err=True)
                sys.exit(1)
            except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
                raise
            except Exception as exc:
                if _reader_went_away(exc):
                    _exit_quietly_on_closed_pipe()
                if os.environ.get(DEBUG_ENV):
                    raise
                # A full disk or a read-only home is named as such (typed), anything else
                # keeps its type and message: never a bare "OSError: [Errno 30]".
                cause = root_cause(exc)
                if as_json:
                    emit_json({"ok": False, "command": name, "error": _error_payload(cause)})
                hint = f" (set {DEBUG_ENV}=1 for a traceback)" if cause.code == "internal" else ""
                click.echo(f"error: {cause}{hint}", err=True)
                sys.exit(1)

        return run  # type: ignore[return-value]

    return wrap


def _reader_went_away(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a write to a pipe nobody reads any more."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, BrokenPipeError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _exit_quietly_on_closed_pipe() -> NoReturn:
    """``storyboard status | head``: the reader has what it wanted; that is a normal end.

    As ``git log | head`` does: no message (there is nobody to tell, and an ``[internal]``
    line would send an operator hunting for a fault that is not there) and the exit status
    of a process SIGPIPE ended (128 + 13), so a ``pipefail`` script still knows the output
    was cut. stdout and stderr are pointed at /dev/null first, or the interpreter's last
    flush of the dead pipe would raise again on the way out.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no real descriptor (a test runner)
            pass
    sys.exit(128 + signal.SIGPIPE)


def _workspace() -> Workspace:
    ws = load_workspace()
    # a PIPELINE_* half of the lease/heartbeat pair that breaks the ledger's
    # other half refuses the command here, not the run it would launch. The `settings`
    # commands, which repair the ledger's half, load the workspace without this check.
    check_environment_against_ledger(ws.ledger.stored_settings)
    return ws


def _run_failure(report: launch.RunReport) -> PipelineError:
    failed = next((s for s in report.steps if s.outcome == "failed"), None)
    waiting = next((s for s in report.steps if s.outcome == "waiting"), None)
    if failed is None and waiting is not None:
        return PipelineError(
            "step.gate_blocked", f"{waiting.step}: {waiting.error} ({report.partition})"
        )
    if failed is None:
        return PipelineError(
            "launch.run_failed",
            f"run {report.run_id} of {report.partition} ended {report.dagster_status}",
        )
    # The way out, unless the failure already names it (an exhausted recovery does).
    known = failed.next_step is None or failed.next_step in (failed.error or "")
    way_out = "" if known else f"; next: {failed.next_step}"
    return PipelineError(
        failed.error_code or "launch.run_failed",
        # the cause first: it is what the operator acts on; the run is for looking it up
        f"{failed.step} failed: {_clip(failed.error, 600)}{way_out} "
        f"(run {report.run_id} of {report.partition})",
    )


def _run_table(report: launch.RunReport) -> str:
    return render_table(
        ["step", "decision", "status", "calls this run", "duration", "note"],
        [
            (
                s.step,
                s.decision,
                s.status,
                s.provider_calls,
                _seconds(s.duration_seconds),
                f"[{s.error_code}] {s.error}" if s.error_code else s.error,
            )
            for s in report.steps
        ],
        terminal_width(),
    )


def _progress_line(progress: launch.Progress, prefix: str = "") -> str:
    mark = "ok  " if progress.ok else "FAIL"
    calls = "-" if progress.provider_calls is None else str(progress.provider_calls)
    took = _seconds(progress.duration_seconds) or "-"
    code = f"[{progress.error_code}] " if progress.error_code else ""
    detail = (
        f"{progress.decision or '-':<22} calls this run={calls:<4} {took}"
        if progress.ok
        else f"{code}{progress.error}"  # whole: it may be the only place the cause shows
    )
    return f"  {prefix}{mark} {progress.step:<22} {detail}"


def _report_invalid_partitions(ws: Workspace) -> list[str]:
    """Warn once per malformed registered partition key (skipped by the command)."""
    for key, error in ws.invalid_partitions.items():
        click.echo(
            f"warning: [{error.code}] registered partition {key!r} skipped: {error.message}; "
            f"delete it from the Dagster instance (the UI's partitions page, or "
            f"instance.delete_dynamic_partition('episodes', {key!r}))",
            err=True,
        )
    return list(ws.invalid_partitions)


# --------------------------------------------------------------------------- commands
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Operate the resume-safe storyboard pipeline (ledger, checkpoints, Dagster runs).

    Environment: PIPELINE_HOME (data root), PIPELINE_DB_URL (ledger; default SQLite under
    PIPELINE_HOME), DAGSTER_HOME (Dagster instance), STORYBOARD_DEFS (module:attr of the
    Definitions; default pipeline_defs.definitions:defs). The judge's limits: PIPELINE_*
    variables override, per process, the ledger's settings (`storyboard settings`).
    """
    quiet_dagster_notices()
    try:  # a bad PIPELINE_* variable refuses every command at start, naming it
        check_environment()
    except PipelineError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)


@main.command()
@operation("migrate")
def migrate(*, as_json: bool) -> dict[str, Any] | None:
    """Bring the ledger database to the head schema revision."""
    ws = _workspace()
    revision = ws.ledger.migrate()
    # Seeds only keys the table does not hold: an operator's `settings set` is never
    # overwritten by a variable that happens to be set where migrate runs.
    seeds = env_ledger_values()
    seeded = ws.ledger.seed_settings(
        seeds, changed_by={k: f"storyboard migrate ({ENV_NAMES[k]}) {_operator()}" for k in seeds}
    )
    payload = {
        "ledger": safe_url(ws.ledger.url),
        "revision": revision,
        "seeded_settings": {k: new for k, (_, new) in seeded.items()},
    }
    if not as_json:
        click.echo(f"ledger {payload['ledger']} is at revision {revision}")
        for key, (_, new) in seeded.items():
            click.echo(f"seeded ledger setting {key}={new} from {ENV_NAMES[key]}")
    return payload


def _operator() -> str:
    """Who changes a setting, for its audit row: user and host/process."""
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown"
    return f"by {user} on {lock_owner()}"


@main.group("settings")
def settings_group() -> None:
    """The judge's limits kept in the ledger, shared by the sensor and every run worker.

    In force: a PIPELINE_* variable where set (per process), else the ledger's value, else
    the default. Every change is audited (table setting_change).
    """


@settings_group.command("show")
@operation("settings show")
def settings_show(*, as_json: bool) -> dict[str, Any] | None:
    """Each setting in force and where it came from (env, ledger, default)."""
    ws = load_workspace()  # not _workspace(): no refusal on the pair it is there to show
    rows = ws.effective_settings.rows()
    if as_json:
        return {"ledger": safe_url(ws.ledger.url), "settings": rows}
    click.echo(
        render_table(
            ["setting", "value", "source", "override variable"],
            [(r["key"], format_value(r["value"]), r["source"], r["env"]) for r in rows],
        )
    )
    return None


# ignore_unknown_options: `settings set lease_seconds -1` must reach the bounds check and
# be refused by them ("greater than 0"), not by click as an unknown option "-1".
@settings_group.command("set", context_settings={"ignore_unknown_options": True})
@click.argument("key")
@click.argument("value")
@operation("settings set")
def settings_set(*, key: str, value: str, as_json: bool) -> dict[str, Any] | None:
    """Set KEY to VALUE in the ledger (validated with the same bounds as the variables)."""
    ws = load_workspace()  # not _workspace(): it repairs the ledger's half of a broken pair
    ws.require_migrated_ledger()
    old, new = ws.ledger.set_setting(
        key, value, changed_by=f"storyboard settings set {_operator()}"
    )
    overridden = bool(os.environ.get(ENV_NAMES[key], "").strip())
    if as_json:
        return {"key": key, "old": old, "new": new, "overridden_here_by_env": overridden}
    click.echo(f"ledger setting {key}: {old if old is not None else '(unset)'} -> {new}")
    if overridden:
        click.echo(
            f"note: {ENV_NAMES[key]} is set in this environment and overrides it for "
            "processes that have it set",
            err=True,
        )
    return None


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
    ws = _workspace()
    result = launch.add_episode(ws, project_id, episode_id, story, replace=replace)
    if not as_json:
        click.echo(
            f"episode {result['partition']}: story {result['story_state']} at {result['story']}"
        )
        click.echo(f"project config {result['project_config_state']}: {result['project_config']}")
        click.echo(f"partition {result['partition']}: {result['partition_registered']}")
    return result


@main.command()
@click.option("--partition", "partition_key", required=True, help="PROJECT/EPISODE")
@click.option("--step", "step_ids", multiple=True, help="Step(s) to launch (default: all).")
@operation("materialize")
def materialize(
    *, partition_key: str, step_ids: tuple[str, ...], as_json: bool
) -> dict[str, Any] | None:
    """Launch a resume run of steps of one partition (judged like any UI launch)."""
    ws = _workspace()
    progress = None if as_json else (lambda p: click.echo(_progress_line(p)))
    report = launch.run_assets(ws, partition_key, list(step_ids) or None, progress=progress)
    _finish_run(report, as_json, "materialize")
    return None


def _finish_run(report: launch.RunReport, as_json: bool, command: str, **extra: Any) -> None:
    """Print a run's report (table or JSON); a failed run exits 1 naming the failed step."""
    if as_json:
        payload = {"ok": report.success, "command": command, **report.as_dict(), **extra}
        if not report.success:
            payload["error"] = _error_payload(_run_failure(report))
        emit_json(payload)
    else:
        click.echo(f"run {report.run_id} ({report.partition}, launch path {report.launch_path})")
        click.echo(_run_table(report))
        click.echo(f"provider calls this run: {report.provider_calls}")
    if not report.success:
        raise CommandFailed(_run_failure(report))


@main.command()
@click.option("--partition", "partition_key", required=True, help="PROJECT/EPISODE")
@click.option("--step", "step_id", required=True, help="The one step to rebuild.")
@click.option(
    "--graphql", "graphql_url", help="Submit through a webserver, e.g. http://localhost:3000"
)
@click.option("--location", help="Code location name (GraphQL only; inferred if unique).")
@click.option("--wait/--no-wait", default=True, help="Wait for a GraphQL-submitted run to finish.")
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
    ws = _workspace()
    report = launch.force_step(
        ws, partition_key, step_id, graphql_url=graphql_url, location=location, wait=wait
    )
    if graphql_url and not wait:
        payload = {"run_id": report.run_id, "partition": partition_key, "step": step_id}
        if not as_json:
            click.echo(f"submitted run {report.run_id} (force {partition_key}:{step_id})")
        return payload
    invalidated = [
        t["step_id"]
        for t in ws.ledger.transitions()
        if t["action"] == "invalidate" and str(t["run_id"] or "").startswith(f"{report.run_id}:")
    ]
    if not as_json and invalidated:
        click.echo(f"invalidated downstream: {', '.join(invalidated)}")
    _finish_run(report, as_json, "force", invalidated=invalidated)
    return None


@main.command()
@click.option("--partition", "partition_key", required=True, help="PROJECT/EPISODE")
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
@click.option(
    "--graphql", "graphql_url", help="Submit through a webserver, e.g. http://localhost:3000"
)
@click.option("--location", help="Code location name (GraphQL only; inferred if unique).")
@click.option("--wait/--no-wait", default=True, help="Wait for a GraphQL-submitted run to finish.")
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
    ws = _workspace()
    plan, report = launch.redraw_step(
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
    _finish_run(report, as_json, "redraw", redraw=plan.as_dict())
    return None


@main.command()
@click.option(
    "--partition", "partitions", multiple=True, help="Limit to PROJECT/EPISODE (repeatable)."
)
@operation("status")
def status(*, partitions: tuple[str, ...], as_json: bool) -> dict[str, Any] | None:
    """Per partition and step: state, what the sensor does now, blocks, costs, durations;
    then the queue, the leases, exhausted recoveries, the last hour and the settings in force.

    "now" and the blocks are the judgement `storyboard decide` and the resume sensor make;
    "last decision" is the last one a run recorded.
    """
    ws = _workspace()
    report = views.status_report(ws, partitions)
    invalid = _report_invalid_partitions(ws)
    storage = _storage_line(ws)
    if as_json:
        settings = ws.effective_settings.rows()
        return {
            **report.as_dict(),
            "invalid_partitions": invalid,
            "settings": settings,
            "storage": storage,
        }
    width = terminal_width()
    # One write for the table (a reader that stops early, e.g. ``head``, cuts it short).
    click.echo("\n".join(_status_table(report.steps, width)) if report.steps else "no partitions")
    lines = ["", *_packed("", _totals_items(report.totals), width)]
    lines += _summary_lines(report.summary, width)
    p95 = [f"{k} {_seconds(v)}" for k, v in report.p95_duration_seconds.items() if v]
    lines += _packed("p95 duration per step:", _listed(p95) or ["-"], width)
    lines += _packed("settings in force:", _settings_items(ws.effective_settings), width)
    lines += _wrap(storage, width) or [storage]
    click.echo("\n".join(lines))
    return {}


def _status_table(steps: Sequence[views.StepState], width: int) -> list[str]:
    """One line per step at 120 columns for the usual states; a block's reason and what to
    do follow its row (as in ``decide``), so nothing about a step is printed twice.

    Backoff shows as the time left in "sensor now" (``deferred 25s``; the timestamp is in
    ``--json``), and a step another run holds a live lease on as ``running``: the sensor
    leaves it to its owner, which is no block.
    """
    rows = [
        (
            s.partition,
            s.step,
            views.shown_status(s.status),
            _sensor_now(s),
            s.last_decision,
            s.recovery_count,
            s.provider_calls,
            _seconds(s.last_duration_seconds),
            f"{s.block_origin}: {s.block_reason}" if s.block_origin else s.block_reason,
        )
        for s in steps
    ]
    headers = ["partition", "step", "status", "sensor now", "last decision", "recov"]
    headers += ["calls total", "last dur", "block"]
    lines, groups = table_lines(headers, rows, width)
    for s, group in zip(steps, groups, strict=True):
        lines += group
        if s.what_to_do:
            _advice(lines, s.what_to_do, width)
    return lines


def _sensor_now(state: views.StepState) -> str | None:
    if state.running_healthy:
        return "running"
    if state.verdict == "deferred" and state.retry_in_seconds is not None:
        return f"deferred {_age(state.retry_in_seconds)}"
    return state.verdict


def _totals_items(t: Mapping[str, Any]) -> list[str]:
    calls = f"provider calls total {t['provider_calls']}"
    if t["unknown_outcome_calls"]:
        calls += f" ({t['unknown_outcome_calls']} of unknown outcome: sent by a worker that died)"
    return [
        f"running {t['running']}",
        f"blocked {t['blocked']}",
        f"failed {t['failed']}",
        f"partial {t['partial']}",
        f"pending {t['pending']}",
        f"never run {t['never_run']}",
        calls,
    ]


# How many exhausted steps are named on their line; the table names every one.
_NAMED_EXHAUSTED = 3


def _summary_lines(summary: views.StatusSummary, width: int) -> list[str]:
    """The queue, the leases, what waits for an operator and the last hour, a line each."""
    q, leases, hour = summary.queue, summary.leases, summary.last_hour
    queued = "-" if q.queued_runs is None else str(q.queued_runs)
    if q.oldest_queued_run_age_seconds is not None:
        queued += f" (oldest {_age(q.oldest_queued_run_age_seconds)})"
    lines = _packed(
        "queue:",
        [
            f"launch now {q.launch}",
            f"waiting {q.waiting}",
            f"deferred {q.deferred}",
            f"oldest wait {_age(q.oldest_wait_seconds)}",
            f"queued runs {queued}",
        ],
        width,
    )
    lines += _packed(
        "leases:",
        [
            f"live {leases.live}",
            f"expired, not yet reclaimed {leases.expired_not_reclaimed}",
            f"in backoff {leases.in_backoff}",
        ],
        width,
    )
    exhausted = [f"{p} {s}" for p, s in summary.recovery_exhausted]
    named = exhausted[:_NAMED_EXHAUSTED]
    if len(exhausted) > len(named):
        named.append(f"and {len(exhausted) - len(named)} more")
    label = f"recoveries exhausted {len(exhausted)}" + (":" if named else "")
    lines += _packed(label, _listed(named), width)
    failed = f"failed {hour.failed}" + (":" if hour.failure_codes else "")
    codes = _listed([f"{code} {n}" for code, n in hour.failure_codes])
    lines += _packed(
        "last hour:",
        [
            f"completed {hour.completed}",
            f"partial {hour.partial}",
            f"p95 {_seconds(hour.p95_duration_seconds) or '-'}",
            f"max {_seconds(hour.max_duration_seconds) or '-'}",
            failed,
            *codes,
        ],
        width,
    )
    return lines


def _settings_items(effective: EffectiveSettings) -> list[str]:
    return [f"{r['key']}={format_value(r['value'])} ({r['source']})" for r in effective.rows()]


def _listed(items: Sequence[str]) -> list[str]:
    """Items of a comma-separated list, each keeping its comma (for :func:`_packed`)."""
    return [f"{item}," for item in items[:-1]] + list(items[-1:])


def _packed(label: str, items: Sequence[str], width: int) -> list[str]:
    """``label`` and the items two spaces apart (one after a list's comma or colon), wrapped
    between items only: an item such as ``lease_seconds=60 (default)`` is never split."""
    lines: list[str] = []
    line = label
    for item in items:
        gap = " " if line == label or line.endswith((",", ":")) else "  "
        if line.strip() and len(line) + len(gap) + len(item) > width:
            lines.append(line)
            line, gap = "  ", ""  # continued under an indent
        line = f"{line}{gap}{item}" if line else item
    return [*lines, line]


def _age(seconds: float | None) -> str:
    """A wait as operators read it: ``45s``, ``12m05s``, ``3h02m``."""
    if seconds is None:
        return "-"
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _storage_line(ws: Workspace) -> str:
    """Where checkpoints are published, and what that means for a second machine."""
    where = ws.pipeline.location()
    if where.storage_url is None:
        return f"checkpoints: files under {where.home} (one shared directory for every worker)"
    line = (
        f"checkpoints: published to {ws.checkpoints.location}; "
        f"{where.home} holds inputs and scratch"
    )
    if where.ledger_url.startswith("sqlite"):
        line += (
            "; the ledger is SQLite: this serves one machine only "
            "(PIPELINE_DB_URL=postgresql+psycopg://… for several)"
        )
    return line


@main.command()
@click.option(
    "--partition", "partitions", multiple=True, help="Limit to PROJECT/EPISODE (repeatable)."
)
@click.option("--all", "show_all", is_flag=True, help="Also list steps the sensor would skip.")
@operation("decide")
def decide(*, partitions: tuple[str, ...], show_all: bool, as_json: bool) -> dict[str, Any] | None:
    """Shadow mode: what the resume sensor would do now. Writes nothing."""
    ws = _workspace()
    decisions = views.shadow_decisions(ws, partitions)
    invalid = _report_invalid_partitions(ws)
    counts = views.verdict_counts(decisions)
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
    for d in shown:
        # waiting / deferred say why in their detail; a block says what to do below its row
        waits = d["verdict"] not in ("blocked", "launch", "skip", "not_applicable")
        text = f"{d['reason']} — {d['detail']}" if waits else d["reason"]
        rows.append((d["partition"], d["step"], d["verdict"], d["action"], d["origin"], text))
    if rows:
        headers = ["partition", "step", "would", "action", "origin", "reason"]
        lines, groups = table_lines(headers, rows, width)
        for d, group in zip(shown, groups, strict=True):
            lines += group
            if d["what_to_do"]:
                _advice(lines, d["what_to_do"], width)
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


@main.command("accept")
@click.option("--partition", "partition_key", required=True, help="PROJECT/EPISODE.")
@click.option("--step", "step_id", required=True, help="The step whose checkpoint was edited.")
@operation("accept")
def accept(*, partition_key: str, step_id: str, as_json: bool) -> dict[str, Any] | None:
    """Keep a hand edit of a checkpoint: the step re-derives what it can (an edited prompt's
    hash), validates and verifies it, and publishes it under the row lock (archived, sealed,
    audited as manual). No model call; downstream steps judge themselves next. An edit the
    step cannot make valid is refused, naming the field, and nothing changes."""
    ws = _workspace()
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


@main.command("sheet")
@click.option("--partition", "partition_key", required=True, help="PROJECT/EPISODE.")
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
    ws = _workspace()
    (episode,) = ws.require_partitions([partition_key], registration_required=False)
    report = sheets.build_sheet(ws, episode)
    target = out or Path(f"storyboard-{episode.project_id}-{episode.episode_id}.html")
    sheets.write_sheet(report, target)
    if as_json:
        return {"out": str(target), **report.as_dict()}
    for line in sheets.sheet_summary_lines(report, target):
        click.echo(line)
    return None


@main.command("gc")
@click.option(
    "--grace-hours",
    type=click.FloatRange(min=0),
    default=garbage.DEFAULT_GRACE.total_seconds() / 3600,
    show_default=True,
    help="Keep any attempt with an object younger than this.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@operation("gc")
def gc(*, grace_hours: float, dry_run: bool, as_json: bool) -> dict[str, Any] | None:
    """Delete attempt prefixes on object storage that no ledger row names (current or
    archived pointers) and whose newest object is older than the grace period."""
    ws = _workspace()
    report = garbage.collect_garbage(ws, grace=timedelta(hours=grace_hours), dry_run=dry_run)
    if as_json:
        return report.as_dict()
    done = report.collection
    verb = "would delete" if dry_run else "deleted"
    click.echo(
        f"{report.storage}: {verb} {len(done.deleted_prefixes)} attempt(s), "
        f"{done.deleted_objects} object(s); kept {done.kept_referenced} named, "
        f"{done.kept_young} younger than {grace_hours:g} h"
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
    ws = _workspace()
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


@main.command("audit-running")
@operation("audit-running")
def audit_running(*, as_json: bool) -> dict[str, Any] | None:
    """Every running ledger row: healthy / lease_expired / dead_owner / future / unparseable /
    NULL started_at (judged as the resume sensor judges it)."""
    ws = _workspace()
    rows = views.audit_running(ws)
    counts = {b: sum(1 for r in rows if r.bucket == b) for b in views.RUNNING_BUCKETS}
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
                        _seconds(r.elapsed_seconds),
                        _clip(r.run_id, 20),
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
@click.option("--partition", "partition_key", required=True, help="PROJECT/EPISODE")
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
            "input.invalid", "give exactly one of --expected-started-at T or --null-started-at"
        )
    result = launch.reset_running(
        _workspace(),
        partition_key,
        step_id,
        None if null_started_at else expected_started_at,
        reason,
    )
    if not as_json:
        click.echo(f"{partition_key}:{step_id}: running → failed ({reason})")
    return result


@main.command()
@click.option("--project", "project_id", default="demo", show_default=True)
@click.option(
    "--stories", "stories_dir", type=click.Path(path_type=Path), help="Folder of *.md stories."
)
@operation("demo")
def demo(*, project_id: str, stories_dir: Path | None, as_json: bool) -> dict[str, Any] | None:
    """Create a sample project with two episodes and materialize everything for both."""
    ws = _workspace()

    def progress(partition: str, item: launch.Progress) -> None:
        click.echo(_progress_line(item, f"{partition}  "), err=as_json)

    if not as_json:
        click.echo(f"storyboard demo: project {project_id!r}, data in {ws.home}")
    report = launch.demo(ws, project_id=project_id, stories_dir=stories_dir, progress=progress)
    if as_json:
        payload = {"ok": report.success, "command": "demo", **report.as_dict()}
        if not report.success:
            failed = next(r for r in report.runs if not r.success)
            payload["error"] = _error_payload(_run_failure(failed))
        emit_json(payload)
    else:
        for run in report.runs:
            click.echo(f"\nepisode {run.partition} (run {run.run_id})")
            click.echo(_run_table(run))
            images = report.images.get(run.partition, [])
            folder = ws.checkpoints.root / run.partition
            per_step: dict[str, int] = {}
            for image in images:
                step = Path(image).relative_to(Path("checkpoints") / run.partition).parts[0]
                per_step[step] = per_step.get(step, 0) + 1
            detail = ", ".join(f"{k}/ {v}" for k, v in per_step.items())
            click.echo(f"images: {len(images)} PNG under {folder}/ ({detail or 'none'})")
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
        raise CommandFailed(_run_failure(failed))
    return None


__all__ = ["DEFS_ENV", "main"]
