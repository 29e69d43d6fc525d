"""Operator actions that write: add an episode, run assets, force, redraw, reset, the demo.

Runs go through the Dagster instance of ``DAGSTER_HOME`` (in-process execution of the
implicit asset job, or a webserver's GraphQL API), so every launch is judged by the same
run protocol as UI, sensor and backfill launches; the CLI only adds the tag
``resume/launch_path=cli`` (and ``resume/mode=force`` for ``force``).

Each concern has its module; this one keeps the names callers import from here:

- :mod:`.episodes`: ``add_episode`` (story checked and copied in, partition registered);
- :mod:`.runs`: ``run_assets`` (in-process), with :mod:`.watcher` (live progress) and
  :mod:`.run_report` (the per-step report of a run);
- :mod:`.graphql`: ``submit_via_graphql`` (through a webserver);
- :mod:`.force`, :mod:`.redraw`: the explicit relaunches;
- :mod:`.reset`: ``reset_running``; :mod:`.demo`: ``demo``.
"""

from pipeline_defs.operations.demo import (
    SAMPLES_DIR,
    DemoReport,
    demo,
    demo_project_yaml,
    episode_id_for,
    list_images,
    sample_stories,
)
from pipeline_defs.operations.episodes import add_episode, default_project_yaml, register_partition
from pipeline_defs.operations.force import FORCE_TAGS, force_step, invalidated_by
from pipeline_defs.operations.graphql import (
    ASSET_JOB,
    TERMINAL_RUN_STATUSES,
    graphql_client,
    submit_via_graphql,
)
from pipeline_defs.operations.redraw import RedrawPlan, plan_redraw, redraw_step
from pipeline_defs.operations.reset import reset_running
from pipeline_defs.operations.run_report import (
    WATCHED,
    Progress,
    RunReport,
    StepReport,
    Timeline,
    summarize_run,
)
from pipeline_defs.operations.run_report import failure_info as _failure_info
from pipeline_defs.operations.runs import CLI_TAGS, QUIET_RUN_CONFIG, run_assets
from pipeline_defs.operations.watcher import RunWatcher

__all__ = [
    "ASSET_JOB",
    "CLI_TAGS",
    "FORCE_TAGS",
    "QUIET_RUN_CONFIG",
    "SAMPLES_DIR",
    "TERMINAL_RUN_STATUSES",
    "WATCHED",
    "DemoReport",
    "Progress",
    "RedrawPlan",
    "RunReport",
    "RunWatcher",
    "StepReport",
    "Timeline",
    "_failure_info",
    "add_episode",
    "default_project_yaml",
    "demo",
    "demo_project_yaml",
    "episode_id_for",
    "force_step",
    "graphql_client",
    "invalidated_by",
    "list_images",
    "plan_redraw",
    "redraw_step",
    "register_partition",
    "reset_running",
    "run_assets",
    "sample_stories",
    "submit_via_graphql",
    "summarize_run",
]
