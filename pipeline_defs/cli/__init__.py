"""``storyboard``: the operator CLI (docs/DESIGN.md#launch-paths). Every command takes ``--json``.

Errors exit non-zero with one line naming the culprit and the typed error code:
``error: [input.invalid_id] invalid project_id '..': ids must match ...``.

One concern per module: :mod:`.app` (the command group, the checked workspace),
:mod:`.render` (tables, hints, JSON; ``--json`` and typed errors → exit 1),
:mod:`.run_output` (how a run is shown), :mod:`.options` (options several commands
share), and the commands by what they act on:
:mod:`.commands_settings`, :mod:`.commands_runs`, :mod:`.commands_status`,
:mod:`.commands_decide`, :mod:`.commands_checkpoints`, :mod:`.commands_running`,
:mod:`.commands_fleet`.
Importing this package registers every command on :func:`main` (``storyboard`` in
pyproject.toml's ``[project.scripts]``).
"""

# The command modules register their commands on `main` when imported.
from pipeline_defs.cli import (  # noqa: F401
    commands_checkpoints,
    commands_decide,
    commands_fleet,
    commands_running,
    commands_runs,
    commands_settings,
    commands_status,
)
from pipeline_defs.cli.app import main
from pipeline_defs.cli.commands_status import _storage_line
from pipeline_defs.cli.render import commands_in, emit_json, render_table, table_lines
from pipeline_defs.operations.workspace import DEFS_ENV

__all__ = [
    "DEFS_ENV",
    "_storage_line",
    "commands_in",
    "emit_json",
    "main",
    "render_table",
    "table_lines",
]
