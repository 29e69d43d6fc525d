"""The ``storyboard`` command group, and what commands start from: the workspace checked
against the ledger, a warning per malformed registered partition."""

import sys

import click

from pipeline_defs.operations.workspace import Workspace, load_workspace, quiet_dagster_notices
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.settings import check_environment, check_environment_against_ledger
from pipeline_defs.wiring.instance_storage import check_dagster_storage


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Operate the resume-safe storyboard pipeline (ledger, checkpoints, Dagster runs).

    Environment: PIPELINE_HOME (data root), PIPELINE_DB_URL (ledger; default SQLite under
    PIPELINE_HOME), DAGSTER_HOME (Dagster instance), STORYBOARD_DEFS (module:attr of the
    Definitions; default pipeline_defs.definitions:defs). The judge's limits: PIPELINE_*
    variables override, per process, the ledger's settings (`storyboard settings`).
    """
    quiet_dagster_notices()
    try:  # a bad PIPELINE_* variable or Dagster storage refuses every command at start
        check_environment()
        check_dagster_storage()
    except PipelineError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)


def checked_workspace() -> Workspace:
    """The workspace a command operates on, its environment checked against the ledger.

    A PIPELINE_* half of the lease/heartbeat pair that breaks the ledger's other half
    refuses the command here, not the run it would launch. The `settings` commands, which
    repair the ledger's half, load the workspace without this check.
    """
    ws = load_workspace()
    check_environment_against_ledger(ws.ledger.stored_settings)
    return ws


def report_invalid_partitions(ws: Workspace) -> list[str]:
    """Warn once per malformed registered partition key (skipped by the command)."""
    for key, error in ws.invalid_partitions.items():
        click.echo(
            f"warning: [{error.code}] registered partition {key!r} skipped: {error.message}; "
            f"delete it from the Dagster instance (the UI's partitions page, or "
            f"instance.delete_dynamic_partition('episodes', {key!r}))",
            err=True,
        )
    return list(ws.invalid_partitions)
