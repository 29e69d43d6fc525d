"""Launching through a webserver's GraphQL API, as the UI does."""

import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline_defs.operations.run_report import WATCHED, RunReport, Timeline, summarize_run
from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.wiring.assets import LAUNCH_PATH_TAG

ASSET_JOB = "__ASSET_JOB"
TERMINAL_RUN_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})


def graphql_client(url: str) -> Any:
    """A ``DagsterGraphQLClient`` for ``http(s)://host[:port][/prefix]``."""
    from dagster_graphql import DagsterGraphQLClient

    parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PipelineError(
            ErrorCode.INPUT_INVALID, f"--graphql {url!r}: expected http(s)://host:port"
        )
    prefix = parsed.path.rstrip("/")
    if prefix.endswith("/graphql"):
        prefix = prefix[: -len("/graphql")]
    return DagsterGraphQLClient(
        parsed.hostname,
        port_number=parsed.port,
        use_https=parsed.scheme == "https",
        path_prefix=prefix,
    )


def submit_via_graphql(
    ws: Workspace,
    url: str,
    partition_key: str,
    step_ids: Sequence[str],
    *,
    tags: Mapping[str, str],
    location: str | None = None,
    wait: bool = True,
    timeout_seconds: float = 3600,
    poll_seconds: float = 0.5,
) -> RunReport:
    """Submit ``__ASSET_JOB`` for an asset selection and partition, as the UI does."""
    from dagster_graphql import DagsterGraphQLClientError

    client = graphql_client(url)
    try:
        run_id = client.submit_job_execution(
            ASSET_JOB,
            repository_location_name=location,
            tags={"dagster/partition": partition_key, **tags},
            asset_selection=list(step_ids),
        )
    except DagsterGraphQLClientError as exc:
        raise PipelineError(
            ErrorCode.LAUNCH_GRAPHQL_FAILED, f"{url}: submission refused: {exc}".splitlines()[0]
        ) from None
    except Exception as exc:  # connection errors
        raise PipelineError(
            ErrorCode.LAUNCH_GRAPHQL_FAILED,
            f"{url}: cannot reach the webserver ({type(exc).__name__})",
        ) from None
    status: str | None = "QUEUED"
    if wait:
        deadline = time.monotonic() + timeout_seconds
        while True:
            status = client.get_run_status(run_id).value
            if status in TERMINAL_RUN_STATUSES or time.monotonic() > deadline:
                break
            time.sleep(poll_seconds)
    timeline = Timeline()
    success = status == "SUCCESS"
    instance = ws.instance(required=False)
    if instance is not None and instance.get_run_by_id(run_id) is not None:
        for record in instance.get_records_for_run(run_id, of_type=WATCHED, limit=10_000).records:
            entry = record.event_log_entry
            if entry.dagster_event is not None:
                timeline.feed(entry.dagster_event, entry.timestamp)
    report = summarize_run(
        ws,
        run_id,
        partition_key,
        list(step_ids),
        timeline,
        success=success,
        launch_path=tags.get(LAUNCH_PATH_TAG, "api"),
        dagster_status=status,
    )
    if not timeline.finished:  # the webserver's instance is not ours: report what we know
        for step in report.steps:
            step.outcome = "unknown" if not wait else ("materialized" if success else "failed")
            step.error = None
    return report
