"""Operator actions that write: add an episode, run assets, force, reset, the demo.

Runs go through the Dagster instance of ``DAGSTER_HOME`` (in-process execution of the
implicit asset job, or a webserver's GraphQL API), so every launch is judged by the same
run protocol as UI, sensor and backfill launches; the CLI only adds the tag
``resume/launch_path=cli`` (and ``resume/mode=force`` for ``force``).
"""

import os
import stat as stat_module
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from pipeline_defs.operations.inspect import DECISION_ACTIONS, judge_now, shown_action, utc_now
from pipeline_defs.operations.workspace import PARTITIONS_NAME, Workspace
from pipeline_defs.project import (
    ProjectConfig,
    StoryKnobs,
    load_project_config,
    parse_project_config,
    refuse_input_links,
    refuse_project_links,
)
from pipeline_defs.resume.causes import root_cause_of_text
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.files import describe_mode, read_nofollow, write_file_under
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import Episode, StepKey, validate_id
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.assets import LAUNCH_PATH_TAG, MODE_TAG
from pipeline_defs.steps.graph import StepGraph, downstream_of
from pipeline_defs.steps.redraw import (
    dependents_of,
    make_redraw,
    resolve_targets,
)
from pipeline_defs.storyboard.story_source import accept_story
from resources.checkpoints.store import ARCHIVE_DIR

ASSET_JOB = "__ASSET_JOB"
CLI_TAGS: Mapping[str, str] = {LAUNCH_PATH_TAG: "cli"}
FORCE_TAGS: Mapping[str, str] = {**CLI_TAGS, MODE_TAG: "force"}
QUIET_RUN_CONFIG: Mapping[str, Any] = {
    "loggers": {"console": {"config": {"log_level": "CRITICAL"}}}
}
TERMINAL_RUN_STATUSES = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
SAMPLES_DIR = Path(__file__).resolve().parent.parent / "storyboard" / "samples"


# --------------------------------------------------------------------------- episodes
def _read_story(path: Path, knobs: StoryKnobs) -> bytes:
    """The operator's story file, refused at the door by the rules ``story_source`` applies
    later (size, NUL bytes, encoding, no text), so nothing is registered that cannot run.

    The source is the operator's own file (following a link to it is theirs to choose);
    what it is when it is not a file is said plainly, and a device or FIFO is never opened
    (``/dev/zero`` would be read forever, a FIFO would hang).
    """
    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise PipelineError("input.invalid", f"story file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise PipelineError(
            "input.invalid", f"story file {str(path)!r} cannot be read: {exc.strerror}"
        ) from None
    if not stat_module.S_ISREG(found.st_mode):
        raise PipelineError(
            "input.invalid",
            f"story file {str(path)!r} is {describe_mode(found.st_mode)}, not a story file",
        )
    try:
        with open(path, "rb") as handle:
            payload = handle.read(knobs.max_bytes + 1)  # never more than the limit allows
    except OSError as exc:
        raise PipelineError(
            "input.invalid", f"story file {str(path)!r} cannot be read: {exc.strerror}"
        ) from None
    accept_story(path, payload, knobs)
    return payload


def _story_knobs(home: Path, project_id: str, config_path: Path, template: bytes) -> StoryKnobs:
    """The story limits in force for the project: its file's, else the template's."""
    if config_path.exists():
        return load_project_config(home, project_id).story  # refuses an invalid file
    raw = yaml.safe_load(template.decode("utf-8"))
    return parse_project_config(raw, source="the project.yaml template").story


def default_project_yaml() -> bytes:
    """``ProjectConfig()`` defaults as YAML."""
    return yaml.safe_dump(ProjectConfig().as_dict(), sort_keys=False).encode("utf-8")


def demo_project_yaml() -> bytes:
    """The demo's project file: the samples' ``project.yaml`` if bundled, else defaults."""
    bundled = SAMPLES_DIR / "project.yaml"
    return bundled.read_bytes() if bundled.is_file() else default_project_yaml()


def register_partition(instance: dg.DagsterInstance, partition_key: str) -> bool:
    """Add the dynamic partition if missing; True if it was added."""
    Episode.parse(partition_key)
    if instance.has_dynamic_partition(PARTITIONS_NAME, partition_key):
        return False
    instance.add_dynamic_partitions(PARTITIONS_NAME, [partition_key])
    return True


def add_episode(
    ws: Workspace,
    project_id: str,
    episode_id: str,
    story: Path,
    *,
    replace: bool = False,
    keep_existing: bool = False,
    config_template: bytes | None = None,
) -> dict[str, Any]:
    """Copy the story in (atomically), create project.yaml if missing, register the partition.

    Ids are validated before any path is built. A different story already in place is
    refused unless ``replace`` (editing a story blocks ``story_source`` until a force).
    """
    validate_id(project_id, "project_id")
    validate_id(episode_id, "episode_id")
    episode = Episode(project_id, episode_id)
    home = Path(ws.home)
    target = Path(DataLayout(str(home)).story_file(project_id, episode_id))
    # Nothing outside the home: a link anywhere on either path is refused before anything
    # below the home is read or created (and the writes re-check it, race-free).
    config_path = refuse_project_links(home, project_id)
    refuse_input_links(home, target)
    template = config_template or default_project_yaml()
    # On object storage the published inputs are the truth: compare with them, not with
    # whatever an earlier process left in this home.
    ws.checkpoints.sync_inputs(project_id, episode_id)
    payload = _read_story(Path(story), _story_knobs(home, project_id, config_path, template))
    instance = ws.instance()  # fail before writing anything if DAGSTER_HOME is unusable
    assert instance is not None
    current = os.lstat(target) if target.exists() else None
    if current is not None and not stat_module.S_ISREG(current.st_mode):
        raise PipelineError(
            "input.invalid",
            f"{target} is {describe_mode(current.st_mode)}, where the episode's story file "
            "should be: nothing is written over it; remove it to go on",
        )
    if current is not None and read_nofollow(target) == payload:
        story_state = "unchanged"
    elif current is not None and keep_existing:
        story_state = "kept existing"
    elif current is not None and not replace:
        raise PipelineError(
            "input.story_exists",
            f"{target} already holds a different story; pass --replace to overwrite it "
            "(story_source will then block until an explicit force)",
            status=409,
        )
    else:
        story_state = "replaced" if current is not None else "created"
        write_file_under(home, target, payload)
    if config_path.exists():
        load_project_config(home, project_id)  # refuse an invalid file, naming the key
        config_state = "exists"
    else:
        write_file_under(home, config_path, template)
        config_state = "created"
    if ws.checkpoints.publish_inputs(project_id, episode_id):  # every machine reads them
        # A seal on object storage names the inputs its run verified by e_tag, and other
        # machines trust it until told: tell them (judged the long way, the edit seen).
        ws.ledger.clear_episode_seals(project_id, episode_id)
    added = register_partition(instance, episode.partition_key)
    return {
        "partition": episode.partition_key,
        "story": str(target),
        "story_state": story_state,
        "project_config": str(config_path),
        "project_config_state": config_state,
        "partition_registered": "added" if added else "already registered",
    }


# --------------------------------------------------------------------------- run reports
@dataclass
class StepReport:
    """One step of one run, as the ledger and the run's events tell it."""

    step: str
    outcome: str  # materialized / failed / not_run / waiting (left out: upstream blocked)
    decision: str | None = None
    status: str = "none"
    provider_calls: int = 0
    duration_seconds: float | None = None
    error_code: str | None = None
    error: str | None = None
    # A blocked step's way out, as ``status``/``decide`` print it (the command that fixes it).
    next_step: str | None = None


@dataclass
class RunReport:
    run_id: str
    partition: str
    success: bool
    launch_path: str
    steps: list[StepReport] = field(default_factory=list)
    dagster_status: str | None = None

    @property
    def provider_calls(self) -> int:
        return sum(s.provider_calls for s in self.steps)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "provider_calls": self.provider_calls}


@dataclass(frozen=True)
class Progress:
    """A step finished inside a running run (for live display)."""

    step: str
    ok: bool
    decision: str | None
    provider_calls: int | None
    duration_seconds: float | None
    error: str | None = None
    error_code: str | None = None


def _metadata_value(entry: Any) -> Any:
    return getattr(entry, "value", entry)


def _failure_info(event: dg.DagsterEvent) -> tuple[str | None, str]:
    """Code and one-line message of a step failure, naming its root cause.

    A typed failure (``dg.Failure`` from the asset or the IO manager) carries both in its
    metadata. Anything else reaches the event log as Dagster's wrapper ("Error occurred
    while executing op ...") with the real error as its cause: that cause is reported.
    """
    data = event.step_failure_data
    metadata = (data.user_failure_data.metadata if data and data.user_failure_data else {}) or {}
    code = _metadata_value(metadata.get("error/code")) if metadata else None
    message = _metadata_value(metadata.get("error/message")) if metadata else None
    if message:
        return (str(code) if code else None), str(message)
    if data is None or data.error is None:
        return None, "failed"
    cause = _root_cause_of(data.error)
    return cause.code, cause.message


def _root_cause_of(error: Any) -> PipelineError:
    """The typed cause of a serialized error (``SerializableErrorInfo``): Dagster's wrappers
    are skipped, a storage fault anywhere in the chain wins, else the first error raised
    outside Dagster keeps its type and message."""
    chain: list[Any] = []
    current = error
    while current is not None and len(chain) < 20:  # a bound, not a cycle guard: it is data
        chain.append(current)
        current = current.cause or current.context
    own = [e for e in chain if not str(e.cls_name or "").startswith("Dagster")] or chain
    causes = [root_cause_of_text(e.message) for e in own]
    return next((c for c in causes if c.code != "internal"), causes[0])


class _Timeline:
    """Folds a run's events into per-step progress records."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.materialized: dict[str, Mapping[str, Any]] = {}
        self.finished: dict[str, Progress] = {}

    def feed(self, event: dg.DagsterEvent, timestamp: float) -> Progress | None:
        step = event.step_key
        if step is None:
            return None
        kind = event.event_type
        if kind == dg.DagsterEventType.STEP_START:
            self.started[step] = timestamp
        elif kind == dg.DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.step_materialization_data.materialization
            self.materialized[step] = {
                k: _metadata_value(v) for k, v in (materialization.metadata or {}).items()
            }
        elif kind in (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE):
            began = self.started.get(step)
            duration = round(timestamp - began, 3) if began is not None else None
            ok = kind == dg.DagsterEventType.STEP_SUCCESS
            meta = self.materialized.get(step, {})
            code, error = (None, None) if ok else _failure_info(event)
            calls = meta.get("resume/provider_calls")
            progress = Progress(
                step=step,
                ok=ok,
                decision=meta.get("resume/decision"),
                provider_calls=int(calls) if calls is not None else None,
                duration_seconds=duration,
                error=error,
                error_code=code,
            )
            self.finished[step] = progress
            return progress
        return None


WATCHED = {
    dg.DagsterEventType.STEP_START,
    dg.DagsterEventType.ASSET_MATERIALIZATION,
    dg.DagsterEventType.STEP_SUCCESS,
    dg.DagsterEventType.STEP_FAILURE,
}


class _Watcher:
    """Tails a run's event log in a thread and reports each step as it finishes."""

    def __init__(
        self, instance: dg.DagsterInstance, run_id: str, report: Callable[[Progress], None]
    ) -> None:
        self.instance = instance
        self.run_id = run_id
        self.report = report
        self.timeline = _Timeline()
        self.cursor: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="storyboard-progress", daemon=True)

    def _drain(self) -> None:
        while True:
            connection = self.instance.get_records_for_run(
                self.run_id, cursor=self.cursor, of_type=WATCHED
            )
            for record in connection.records:
                entry = record.event_log_entry
                if entry.dagster_event is None:
                    continue
                progress = self.timeline.feed(entry.dagster_event, entry.timestamp)
                if progress is not None:
                    self.report(progress)
            self.cursor = connection.cursor
            if not connection.has_more:
                return

    def _loop(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self._drain()
            except Exception:  # the run may not exist yet; progress is best effort
                continue

    def __enter__(self) -> "_Watcher":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for _attempt in range(40):  # the final drain must see every event (storage may be busy)
            try:
                self._drain()
                return
            except Exception:
                time.sleep(0.25)
        self._drain()


def _owned_by(run_id: str) -> Callable[[Mapping[str, Any]], bool]:
    prefix = f"{run_id}:"
    return lambda row: str(row.get("run_id") or "").startswith(prefix)


def summarize_run(
    ws: Workspace,
    run_id: str,
    partition_key: str,
    step_ids: Sequence[str],
    timeline: _Timeline,
    *,
    success: bool,
    launch_path: str,
    dagster_status: str | None = None,
) -> RunReport:
    """Per step: decision and claim from the audit rows of this run, status from the ledger,
    provider calls from the cost ledger, duration from the run's events."""
    episode = Episode.parse(partition_key)
    mine = _owned_by(run_id)
    rows = ws.ledger.get_many(episodes=[episode], step_ids=list(step_ids))
    report = RunReport(run_id, partition_key, success, launch_path, dagster_status=dagster_status)
    for step_id in step_ids:
        key = episode.step(step_id)
        audit = [t for t in ws.ledger.transitions(key) if mine(t)]
        decided = next((t for t in audit if t["action"] in DECISION_ACTIONS), None)
        decision = shown_action(decided["action"], decided["reason"]) if decided else None
        progress = timeline.finished.get(step_id)
        row = rows.get(key)
        step = StepReport(
            step=step_id,
            outcome="not_run" if progress is None else "materialized" if progress.ok else "failed",
            decision=decision or (progress.decision if progress else None),
            status=str(row.status) if row else "none",
            provider_calls=sum(1 for c in ws.ledger.provider_calls(key) if mine(c)),
            duration_seconds=progress.duration_seconds if progress else None,
        )
        if progress is not None and not progress.ok:
            step.error, step.error_code = progress.error, progress.error_code
        elif progress is None:
            step.error = "not run: an upstream step in this run did not materialize"
        report.steps.append(step)
    return report


# --------------------------------------------------------------------------- running assets
def _check_partition(ws: Workspace, partition_key: str) -> dg.DagsterInstance:
    """A run needs the partition registered in the instance (as the UI and sensor do)."""
    ws.require_partitions([partition_key])
    instance = ws.instance()
    assert instance is not None
    return instance


def run_assets(
    ws: Workspace,
    partition_key: str,
    step_ids: Sequence[str] | None = None,
    *,
    tags: Mapping[str, str] = CLI_TAGS,
    progress: Callable[[Progress], None] | None = None,
) -> RunReport:
    """Materialize ``step_ids`` (default: all) of one partition in-process, judged as any run."""
    if not ws.steps:
        raise PipelineError(
            "input.invalid", "the code location defines no steps (STORYBOARD_STEPS is empty)"
        )
    selected = [ws.step(s).step_id for s in (step_ids or [s.step_id for s in ws.steps])]
    instance = _check_partition(ws, partition_key)
    blocked, waiting = _blocked_and_waiting(ws, partition_key, selected)
    selected = [s for s in selected if s not in waiting]
    run_id = str(uuid.uuid4())
    if not selected:  # everything asked for waits on a block: launch nothing
        report = RunReport(run_id, partition_key, False, tags.get(LAUNCH_PATH_TAG, "api"))
        report.steps = [StepReport(step=s, outcome="waiting", error=w) for s, w in waiting.items()]
        return report
    watcher = _Watcher(instance, run_id, progress or (lambda _p: None))
    with watcher:
        result = ws.job().execute_in_process(
            partition_key=partition_key,
            instance=instance,
            raise_on_error=False,
            run_id=run_id,
            tags=dict(tags),
            asset_selection=[dg.AssetKey(s) for s in selected],
            run_config=dict(QUIET_RUN_CONFIG),
        )
    report = summarize_run(
        ws,
        run_id,
        partition_key,
        selected,
        watcher.timeline,  # drained to the end when the watcher stopped
        success=result.success,
        launch_path=tags.get(LAUNCH_PATH_TAG, "api"),
        dagster_status="SUCCESS" if result.success else "FAILURE",
    )
    for step in report.steps:
        if step.outcome == "failed" and step.step in blocked:  # the block's way out
            step.next_step = blocked[step.step]
    for step_id, why in waiting.items():
        report.steps.append(StepReport(step=step_id, outcome="waiting", error=why))
    if waiting:
        report.success = False  # what was asked for is not all done
    return report


def _blocked_and_waiting(
    ws: Workspace, partition_key: str, selected: Sequence[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Judged as the sensor judges now: the selected steps that are blocked (with what to do
    about each) and the selected steps downstream of one, which can only wait on it.

    The blocked step is still launched: its run fails with the block's typed code, the true
    record. Its dependents are left out of the run: launched, Dagster would skip them and
    show them failed, although nothing is wrong with them (docs/DESIGN.md#launch-paths).
    """
    judged = judge_now(ws, [Episode.parse(partition_key)], utc_now())
    blocked = {
        item["step"]: item["what_to_do"] or item["reason"]
        for item in judged
        if item["verdict"] == "blocked"
    }
    graph = StepGraph(ws.steps)
    waiting: dict[str, str] = {}
    for step_id in selected:
        if step_id in blocked:
            continue
        upstream = [u for u in graph.upstream(step_id) if u in blocked]
        if upstream:
            ways = "; ".join(f"{u}: next: {blocked[u]}" for u in upstream if u not in selected)
            waiting[step_id] = (
                f"not launched: it waits on blocked upstream {', '.join(upstream)}"
                + (f" ({ways})" if ways else "")
            )
    return blocked, waiting


# --------------------------------------------------------------------------- force
def force_step(
    ws: Workspace,
    partition_key: str,
    step_id: str,
    *,
    graphql_url: str | None = None,
    location: str | None = None,
    wait: bool = True,
    timeout_seconds: float = 3600,
) -> RunReport:
    """Launch one asset partition with ``resume/mode=force`` (in-process or via GraphQL)."""
    step = ws.step(step_id)
    Episode.parse(partition_key)
    if graphql_url is None:
        return run_assets(ws, partition_key, [step.step_id], tags=FORCE_TAGS)
    return submit_via_graphql(
        ws,
        graphql_url,
        partition_key,
        [step.step_id],
        tags=FORCE_TAGS,
        location=location,
        wait=wait,
        timeout_seconds=timeout_seconds,
    )


# --------------------------------------------------------------------------- redraw
@dataclass
class RedrawPlan:
    """What a redraw launch asks for, and the pictures built from those items."""

    step: str
    items: list[str]
    with_dependents: bool
    selection: list[str]
    dependents: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_redraw(
    ws: Workspace, partition_key: str, step_id: str, items: Sequence[str], *, with_dependents: bool
) -> RedrawPlan:
    """Validate the request (typed errors before any launch) and choose the assets to run:
    the step, plus with dependents the redrawable steps downstream of it."""
    step = ws.step(step_id)
    episode = Episode.parse(partition_key)
    request = make_redraw(items, with_dependents=with_dependents)
    key = episode.step(step.step_id)

    def load(other: str) -> Any:
        return ws.checkpoints.load(episode.step(other))

    # The same resolution the run makes: an unknown item fails here, before a launch.
    targets = sorted(resolve_targets(step, key, request, load, ws.steps))
    selection = [step.step_id]
    if with_dependents:
        downstream = downstream_of(ws.steps, step.step_id)
        selection += [s for s in downstream if ws.step(s).redrawable]
    return RedrawPlan(
        step.step_id,
        targets,
        with_dependents,
        selection,
        dependents_of(ws.steps, load, step.step_id, targets),
    )


def redraw_step(
    ws: Workspace,
    partition_key: str,
    step_id: str,
    items: Sequence[str],
    *,
    with_dependents: bool = False,
    graphql_url: str | None = None,
    location: str | None = None,
    wait: bool = True,
    timeout_seconds: float = 3600,
) -> tuple[RedrawPlan, RunReport]:
    """Launch a redraw of ``items`` (tag ``resume/redraw``), in-process or via GraphQL."""
    plan = plan_redraw(ws, partition_key, step_id, items, with_dependents=with_dependents)
    request = make_redraw(items, with_dependents=with_dependents)
    tags = {**CLI_TAGS, **request.as_tags()}
    if graphql_url is None:
        return plan, run_assets(ws, partition_key, plan.selection, tags=tags)
    report = submit_via_graphql(
        ws,
        graphql_url,
        partition_key,
        plan.selection,
        tags=tags,
        location=location,
        wait=wait,
        timeout_seconds=timeout_seconds,
    )
    return plan, report


def graphql_client(url: str) -> Any:
    """A ``DagsterGraphQLClient`` for ``http(s)://host[:port][/prefix]``."""
    from dagster_graphql import DagsterGraphQLClient

    parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise PipelineError("input.invalid", f"--graphql {url!r}: expected http(s)://host:port")
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
            "launch.graphql_failed", f"{url}: submission refused: {exc}".splitlines()[0]
        ) from None
    except Exception as exc:  # connection errors
        raise PipelineError(
            "launch.graphql_failed", f"{url}: cannot reach the webserver ({type(exc).__name__})"
        ) from None
    status: str | None = "QUEUED"
    if wait:
        deadline = time.monotonic() + timeout_seconds
        while True:
            status = client.get_run_status(run_id).value
            if status in TERMINAL_RUN_STATUSES or time.monotonic() > deadline:
                break
            time.sleep(poll_seconds)
    timeline = _Timeline()
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


# --------------------------------------------------------------------------- reset
def reset_running(
    ws: Workspace,
    partition_key: str,
    step_id: str,
    expected_started_at: str | None,
    reason: str,
) -> dict[str, Any]:
    """Expected-match reset of a running row to failed; refuses if the row changed.

    The step and the partition are checked first, so a typo is named as one instead of
    being reported as a row that does not exist. A step the code location no longer has
    is accepted while the ledger still holds a row of it (that row may be stuck too).
    """
    validate_id(step_id, "step_id")
    if step_id not in ws.catalog and not (
        ws.ledger_ready() and ws.ledger.get(Episode.parse(partition_key).step(step_id))
    ):
        ws.step(step_id)  # raises, listing the steps the code location has
    episode = ws.require_partitions([partition_key], registration_required=False)[0]
    key: StepKey = episode.step(step_id)
    ws.require_migrated_ledger()
    before = ws.ledger.get(key)
    if not ws.ledger.reset_running(key, expected_started_at, reason):
        found = (
            "there is no ledger row for it"
            if before is None
            else f"the row is {before.status} with started_at {before.started_at!r}"
        )
        raise PipelineError(
            "step.reset_refused",
            f"{key}: refused: {found}, expected running with started_at "
            f"{expected_started_at!r}; nothing changed",
            status=409,
        )
    ws.ledger.append_transition(
        key,
        action="reset_running",
        from_status=StepStatus.RUNNING,
        to_status=StepStatus.FAILED,
        reason=reason,
        run_id=before.run_id if before else None,
        launch_path="cli",
    )
    return {
        "partition": partition_key,
        "step": step_id,
        "from": StepStatus.RUNNING.value,
        "to": StepStatus.FAILED.value,
        "previous_run_id": before.run_id if before else None,
        "started_at": expected_started_at,
        "reason": reason,
    }


# --------------------------------------------------------------------------- demo
@dataclass
class DemoReport:
    project: str
    episodes: list[dict[str, Any]]
    runs: list[RunReport]
    images: dict[str, list[str]]

    @property
    def provider_calls(self) -> int:
        return sum(r.provider_calls for r in self.runs)

    @property
    def success(self) -> bool:
        return all(r.success for r in self.runs)

    @property
    def all_skipped(self) -> bool:
        return all(s.decision == "skip" for r in self.runs for s in r.steps)

    def as_dict(self) -> dict[str, Any]:
        return {
            "project": self.project,
            "episodes": self.episodes,
            "runs": [r.as_dict() for r in self.runs],
            "images": self.images,
            "provider_calls": self.provider_calls,
            "all_skipped": self.all_skipped,
            "success": self.success,
        }


def sample_stories(folder: Path | None = None, count: int = 2) -> dict[str, Path]:
    """Episode id -> story file: the bundled samples, or the first ``count`` *.md of a folder."""
    if folder is None:
        from pipeline_defs.storyboard import sample_stories as bundled

        stories = dict(bundled())
        if len(stories) >= count:
            return dict(list(stories.items())[:count])
        folder = SAMPLES_DIR
    found = sorted(Path(folder).glob("*.md")) if Path(folder).is_dir() else []
    if len(found) < count:
        raise PipelineError(
            "input.invalid", f"need {count} sample stories (*.md) in {folder}, found {len(found)}"
        )
    return {episode_id_for(p): p for p in found[:count]}


def episode_id_for(story: Path) -> str:
    """``01-the-lighthouse.md`` -> ``01-the-lighthouse`` (ids stay within the safe alphabet)."""
    cleaned = "".join(c if c.isalnum() or c in "-_" else "-" for c in story.stem)[:64]
    return validate_id(cleaned or "episode", "episode_id")


def list_images(ws: Workspace, episode: Episode) -> list[str]:
    layout = ws.checkpoints.layout
    root = Path(layout.checkpoint_episode_dir(episode.project_id, episode.episode_id))
    return sorted(
        str(p) for p in root.rglob("*.png") if ARCHIVE_DIR not in p.relative_to(root).parts
    )


def demo(
    ws: Workspace,
    *,
    project_id: str = "demo",
    stories_dir: Path | None = None,
    progress: Callable[[str, Progress], None] | None = None,
) -> DemoReport:
    """Sample project with two episodes, registered and materialized end to end."""
    validate_id(project_id, "project_id")
    if not ws.steps:
        raise PipelineError(
            "input.invalid", "the code location defines no steps (STORYBOARD_STEPS is empty)"
        )
    added = [
        add_episode(
            ws,
            project_id,
            episode_id,
            story,
            keep_existing=True,
            config_template=demo_project_yaml(),
        )
        for episode_id, story in sample_stories(stories_dir).items()
    ]
    runs: list[RunReport] = []
    for entry in added:
        partition = entry["partition"]
        report = (lambda p: lambda item: progress(p, item))(partition) if progress else None
        runs.append(run_assets(ws, partition, progress=report))
    images = {
        r.partition: [
            str(Path(i).relative_to(ws.home)) for i in list_images(ws, Episode.parse(r.partition))
        ]
        for r in runs
    }
    return DemoReport(project_id, added, runs, images)
