"""Dagster's run retries stop where the judge stops (docs/DESIGN.md#recovery-buttons).

With ``run_retries`` enabled in the instance (or a run's ``dagster/max_retries`` tag), the
daemon re-executes every failed run, up to its retries. A provider failure is worth that:
the retry pays only for what is missing. A stop is not: a BLOCK, or the spend cap, fails
the retry at once in the same way, run after run. So the failure of a stopped step first
tags its own run ``dagster/retry_on_asset_or_op_failure=false`` (Dagster's public tag: a
run failed by an asset or op failure is then not retried), naming why in
``resume/run_retries``; the stop itself is the judge's (``recorded_verdicts.is_stop``).

A re-execution (the UI's buttons) carries its parent's tags: at its start, a stop tag it
inherited is taken back (:func:`reopen_run_retries`, called by the run's coordinator), so
a re-execution that later fails on the provider is retried as any run is.
"""

import logging

import dagster as dg

from pipeline_defs.resume.errors import PipelineError

RETRY_ON_FAILURE_TAG = "dagster/retry_on_asset_or_op_failure"
RUN_RETRIES_TAG = "resume/run_retries"
STOPPED = "stopped"
REOPENED = "open: the stop was its parent's"

_log = logging.getLogger(__name__)


def _retries_step_failures(instance: dg.DagsterInstance, tags: dict[str, str]) -> bool:
    """Whether a step failure of a run with ``tags`` is retried (Dagster's rule: the tag,
    else the instance's ``run_retries.retry_on_asset_or_op_failure``)."""
    value = tags.get(RETRY_ON_FAILURE_TAG)
    if value is None:
        return bool(instance.run_retries_retry_on_asset_or_op_failure)
    return value.strip().lower() == "true"


def stop_run_retries(
    instance: dg.DagsterInstance, run_id: str, step_id: str, error: PipelineError
) -> None:
    """Before the step fails on a stop: its run is not to be retried (a no-op when run
    retries are off, or step failures are not retried anyway). Fail-soft: a tag that
    cannot be written leaves the failure as it is, and the retry blocks again."""
    try:
        if not instance.run_retries_enabled:
            return
        run = instance.get_run_by_id(run_id)
        if run is None or not _retries_step_failures(instance, dict(run.tags)):
            return
        why = f"{STOPPED} by {step_id} [{error.code}] in run {run_id}"
        instance.add_run_tags(run_id, {RETRY_ON_FAILURE_TAG: "false", RUN_RETRIES_TAG: why})
    except Exception as exc:  # the step's own failure is what matters
        _log.warning("run %s: could not stop its run retries (%s)", run_id, exc)


def reopen_run_retries(instance: dg.DagsterInstance, run: dg.DagsterRun) -> None:
    """At a run's start: the stop tags it inherited from the run it re-executes (a
    re-execution copies its parent's tags) are taken back; its own failures decide."""
    said = run.tags.get(RUN_RETRIES_TAG, "")
    if not said.startswith(STOPPED) or said.endswith(f"in run {run.run_id}"):
        return
    try:
        instance.add_run_tags(run.run_id, {RETRY_ON_FAILURE_TAG: "true", RUN_RETRIES_TAG: REOPENED})
    except Exception as exc:
        _log.warning("run %s: could not reopen its run retries (%s)", run.run_id, exc)
