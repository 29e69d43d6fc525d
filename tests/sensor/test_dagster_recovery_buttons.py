"""Dagster's own recovery buttons go through the judge (docs/DESIGN.md#recovery-buttons).

One ``dagster dev`` (webserver + daemons) for the module, on the shipped wiring of the ten
storyboard steps (``daemon_location.storyboard_defs``), its instance's ``dagster.yaml``
enabling run retries as Dagster documents them (``run_retries: {enabled: true,
max_retries: 2}``). The resume sensor is stopped: only the buttons launch. The projects
call an OpenAI-compatible endpoint started here (``openai_server``), which answers like a
real one except where a test makes it fail: HTTP 500 on every attempt of the
``scene_detail`` request for the story's third scene ("Tobin on the Water"), so the step
fails ``provider.retries_exhausted`` after two of its four calls were paid.

Each button is driven through GraphQL as the UI sends it:

- "Re-execute from failure" and "Re-execute all steps" of a failed run
  (``launchPipelineReexecution`` with ``FROM_FAILURE`` / ``ALL_STEPS`` and the UI's tag);
- run retries (the daemon's automatic re-execution of a failed run, the instance default
  or a run's ``dagster/max_retries`` tag);
- a backfill's "Re-execute" of its failed partitions (``reexecutePartitionBackfill``: a new
  backfill of what failed).

Each must pay only what is missing (the provider calls of each Dagster run, counted in the
ledger; the two replies paid before the failure are taken back from the journal), and none
may loop on a stop that a retry would meet again: a BLOCK (a hand-edited checkpoint) and
the spend cap (``[budget.exhausted]``) are not retried by run retries, and a button pressed
on them launches one run that blocks again, paying nothing.
"""

import json
import os
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from cli_helpers import TESTS_DIR
from dagster_dev import dagster_dev, graphql, log_tail, sensor_selector, write_workspace
from openai_server import CHAT, FakeOpenAI, Reply, serving

from pipeline_defs.resume.partition import Episode
from pipeline_defs.storyboard import sample_stories
from resources.ledger.store import LedgerStore

pytestmark = [pytest.mark.webserver, pytest.mark.xdist_group("recovery_buttons")]

LOCATION = "recovery_buttons"
KEY_ENV = "SB_RECOVERY_PROVIDER_KEY"
TEXT_MODEL = "gpt-recovery-text"
# The text steps up to scene_detail: what every run here selects (no pictures: quick).
STEPS = ("story_source", "entity_canon", "world_guide", "scene_detail")
# A clean run of them on the lantern keeper story: one call each, scene_detail one per scene.
CLEAN = {"entity_canon": 1, "world_guide": 1, "scene_detail": 4}
FAILING_SCENE = "Tobin on the Water"  # the third of the four scenes
ATTEMPTS = 5  # the SDK's first attempt and its four retries (``max_retries`` default)
INSTANCE_MAX_RETRIES = 2
NO_RETRY = {"dagster/max_retries": "0"}  # the buttons' runs: left to the button, not the daemon
UI_TAGS = [{"key": "dagster/from_ui", "value": "true"}]
TERMINAL = frozenset({"SUCCESS", "FAILURE", "CANCELED"})
# The daemon that retries runs looks for failed runs every second here (Dagster's default:
# five), so a failed run it would retry has its retry within this grace.
RETRY_POLL = {"DAGSTER_EVENT_LOG_CONSUMER_DAEMON_INTERVAL_SECONDS": "1"}
RETRY_GRACE_S = 6.0

STOP_SENSOR = """
mutation($id: String) { stopSensor(id: $id) { __typename ... on PythonError { message } } }
"""
SENSOR_ID = """
query($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) { __typename ... on Sensor { sensorState { id } } }
}
"""
LAUNCH_RUN = """
mutation($executionParams: ExecutionParams!) {
  launchPipelineExecution(executionParams: $executionParams) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""
# What the UI's "Re-execute" menu sends (ReexecutionParams with the UI's own tag).
REEXECUTE = """
mutation LaunchPipelineReexecution($reexecutionParams: ReexecutionParams) {
  launchPipelineReexecution(reexecutionParams: $reexecutionParams) {
    __typename
    ... on LaunchRunSuccess { run { id rootRunId parentRunId } }
    ... on PythonError { message }
    ... on InvalidSubsetError { message }
  }
}
"""
BACKFILL = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""
# What the backfill page's "Re-execute" sends (the UI's reexecuteBackfill mutation).
REEXECUTE_BACKFILL = """
mutation reexecuteBackfill($reexecutionParams: ReexecutionParams!) {
  reexecutePartitionBackfill(reexecutionParams: $reexecutionParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
  }
}
"""


class Endpoint:
    """The fake endpoint with one switch: the failing scene answers 500 for ``attempts``
    more requests (``None``: until healed)."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.fake = fake
        self.left: int | None = 0
        self.failed = 0
        fake.rule = self._rule

    def fail_scene(self, attempts: int | None = None) -> None:
        with self.fake.lock:
            self.left = attempts

    def heal(self) -> None:
        with self.fake.lock:
            self.left = 0

    def _rule(self, path: str, request: dict[str, Any]) -> Reply | None:  # under fake.lock
        failing = self.left is None or self.left > 0
        if path != CHAT or not failing:
            return None
        system, user = request["messages"][0]["content"], request["messages"][1]["content"]
        if not system.startswith("You are the scene_detail step"):
            return None
        payload = json.loads(user.partition("\n\nINPUT:\n")[2])
        if payload.get("heading") != FAILING_SCENE:
            return None
        if self.left is not None:
            self.left -= 1
        self.failed += 1
        return Reply(500, {"error": {"message": "upstream exploded"}}, {"retry-after-ms": "10"})


@dataclass
class Recovery:
    url: str
    log: Path
    home: Path
    instance: dg.DagsterInstance
    ledger: LedgerStore
    endpoint: Endpoint

    # ------------------------------------------------------------------ inputs
    def add_episode(self, partition: str, story: str = "ep01") -> Episode:
        episode = Episode.parse(partition)
        path = self.home / "projects" / episode.project_id / "episodes" / episode.episode_id
        path.mkdir(parents=True)
        (path / "story.md").write_bytes(sample_stories()[story].read_bytes())
        self.instance.add_dynamic_partitions("episodes", [partition])
        return episode

    def project(self, project_id: str, **extra: Any) -> None:
        config = {
            "provider": {
                "kind": "openai",
                "base_url": self.endpoint.fake.base_url,
                "text_model": TEXT_MODEL,
                "image_model": "gpt-recovery-image",
                "timeout_seconds": 5,
                "api_key_env": KEY_ENV,
            },
            **extra,
        }
        path = self.home / "projects" / project_id / "project.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config), encoding="utf-8")

    def checkpoint(self, episode: Episode, step_id: str) -> Path:
        return (
            self.home
            / "checkpoints"
            / episode.project_id
            / episode.episode_id
            / step_id
            / "checkpoint.json"
        )

    # ------------------------------------------------------------------ buttons
    def launch(
        self, partition: str, steps: Sequence[str], tags: Mapping[str, str] | None = None
    ) -> str:
        """A run of ``steps`` on ``partition``, as the UI's materialize dialog launches it."""
        all_tags = {"dagster/partition": partition, "dagster/from_ui": "true", **(tags or {})}
        params = {
            "selector": {
                "repositoryLocationName": LOCATION,
                "repositoryName": "__repository__",
                "pipelineName": "__ASSET_JOB",
                "assetSelection": [{"path": [s]} for s in steps],
            },
            "mode": "default",
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in all_tags.items()]},
        }
        launched = graphql(self.url, LAUNCH_RUN, {"executionParams": params})
        result = launched["launchPipelineExecution"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return str(result["run"]["runId"])

    def reexecute(self, run_id: str, strategy: str) -> str:
        params = {"parentRunId": run_id, "strategy": strategy, "extraTags": UI_TAGS}
        data = graphql(self.url, REEXECUTE, {"reexecutionParams": params})
        result = data["launchPipelineReexecution"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return str(result["run"]["id"])

    def backfill(
        self, partitions: Sequence[str], steps: Sequence[str], tags: Mapping[str, str]
    ) -> str:
        params = {
            "partitionNames": list(partitions),
            "assetSelection": [{"path": [s]} for s in steps],
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
        }
        result = graphql(self.url, BACKFILL, {"params": params})["launchPartitionBackfill"]
        assert result["__typename"] == "LaunchBackfillSuccess", result
        return str(result["backfillId"])

    def reexecute_backfill(self, backfill_id: str, strategy: str) -> str:
        params = {"parentRunId": backfill_id, "strategy": strategy}
        data = graphql(self.url, REEXECUTE_BACKFILL, {"reexecutionParams": params})
        result = data["reexecutePartitionBackfill"]
        assert result["__typename"] == "LaunchBackfillSuccess", result
        return str(result["backfillId"])

    # ------------------------------------------------------------------ what happened
    def run(self, run_id: str) -> dg.DagsterRun:
        found = self.instance.get_run_by_id(run_id)
        assert found is not None, run_id
        return found

    def wait(self, what: str, predicate: Any, timeout: float = 240) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}\n{log_tail(self.log)}")

    def ended(self, run_id: str) -> dg.DagsterRun:
        return self.wait(  # type: ignore[no-any-return]
            f"run {run_id} to end",
            lambda: (r := self.run(run_id)).status.value in TERMINAL and r,
        )

    def group(self, run_id: str) -> list[dg.DagsterRun]:
        """Every run of ``run_id``'s group (its re-executions and retries), oldest first."""
        found = self.instance.get_run_group(run_id)
        assert found is not None
        return sorted(found[1], key=lambda r: self.started(r.run_id))

    def started(self, run_id: str) -> float:
        record = self.instance.get_run_record_by_id(run_id)
        assert record is not None
        return record.create_timestamp.timestamp()

    def settled(self, run_id: str) -> list[dg.DagsterRun]:
        """The run's group once every run of it has ended and the daemon has had time to
        retry the last failure (and, if it retried, that retry has ended too)."""
        while True:
            runs = self.group(run_id)
            for r in runs:
                self.ended(r.run_id)
            time.sleep(RETRY_GRACE_S)
            if len(self.group(run_id)) == len(runs):
                return self.group(run_id)

    def calls_by_run(self, episode: Episode) -> Counter[str]:
        """Provider calls recorded for ``episode``, by the Dagster run that made them."""
        rows = self.ledger.provider_calls(episode=episode)
        return Counter(str(c["run_id"]).split(":", 1)[0] for c in rows)

    def calls_by_step(self, episode: Episode, run_id: str | None = None) -> Counter[str]:
        rows = self.ledger.provider_calls(episode=episode)
        return Counter(
            str(c["step_id"])
            for c in rows
            if run_id is None or str(c["run_id"]).startswith(f"{run_id}:")
        )

    def failure_code(self, run_id: str) -> str | None:
        """The code of the step failure of ``run_id`` (``[code] ...`` of its description)."""
        records = self.instance.get_records_for_run(
            run_id, of_type=dg.DagsterEventType.STEP_FAILURE
        ).records
        for record in records:
            event = record.event_log_entry.dagster_event
            assert event is not None
            error = event.step_failure_data.error
            text = error.message if error is not None else ""
            if "[" in text:
                return text.split("[", 1)[1].split("]", 1)[0]
        return None


@pytest.fixture(scope="module")
def recovery(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recovery]:
    tmp = tmp_path_factory.mktemp("recovery")
    home, dagster_home = tmp / "home", tmp / "dagster_home"
    home.mkdir()
    dagster_home.mkdir()
    config = {
        "telemetry": {"enabled": False},
        "run_retries": {"enabled": True, "max_retries": INSTANCE_MAX_RETRIES},
    }
    (dagster_home / "dagster.yaml").write_text(yaml.safe_dump(config))
    workspace = write_workspace(
        tmp / "workspace.yaml", "daemon_location", "storyboard_defs", LOCATION, TESTS_DIR
    )
    python_path = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(":")
    ledger_url = f"sqlite:///{home / 'ledger.sqlite3'}"
    env = {
        **os.environ,
        "PIPELINE_HOME": str(home),
        "PIPELINE_DB_URL": ledger_url,
        "DAGSTER_HOME": str(dagster_home),
        "PYTHONPATH": python_path,
        KEY_ENV: "sk-recovery-0123456789",
        **RETRY_POLL,
    }
    env.pop("STORYBOARD_DEFS", None)
    instance = dg.DagsterInstance.from_config(str(dagster_home))
    log = tmp / "dagster_dev.log"
    try:
        with serving(fallback=True) as fake, dagster_dev(workspace, env, tmp, log) as (url, _):
            # No episode is registered yet, so the sensor (on by default) has launched
            # nothing: stopped, only the buttons launch from here on.
            selector = sensor_selector(LOCATION)
            state = graphql(url, SENSOR_ID, {"selector": selector})["sensorOrError"]
            stopped = graphql(url, STOP_SENSOR, {"id": state["sensorState"]["id"]})
            assert stopped["stopSensor"]["__typename"] == "StopSensorMutationResult", stopped
            d = Recovery(url, log, home, instance, LedgerStore(ledger_url), Endpoint(fake))
            d.project("demo")
            d.project("capped", budget={"max_calls_per_episode": 4})
            yield d
    finally:
        instance.dispose()


def _failed_at_scene_detail(d: Recovery, episode: Episode, run_id: str) -> None:
    """The run failed on the provider part way through scene_detail: two of its four
    scenes paid, the third sent and failed, the fourth never asked."""
    run = d.ended(run_id)
    assert run.status.value == "FAILURE", run.status
    assert d.failure_code(run_id) == "provider.retries_exhausted"
    assert d.calls_by_step(episode, run_id) == {**CLEAN, "scene_detail": 3}
    rows = {k.step_id: r for k, r in d.ledger.get_many(episodes=[episode]).items()}
    assert str(rows["scene_detail"].status) == "failed"


def _paid_only_what_was_missing(d: Recovery, episode: Episode, first: str, second: str) -> None:
    """``second`` paid the two scenes never answered, nothing else; the episode's calls are
    a clean run's plus the one that failed."""
    assert d.calls_by_run(episode) == {first: 5, second: 2}
    assert d.calls_by_step(episode, second) == {"scene_detail": 2}
    assert d.ledger.episode_calls(episode.project_id, episode.episode_id) == 6 + 1
    rows = {k.step_id: r for k, r in d.ledger.get_many(episodes=[episode]).items()}
    assert {s: str(r.status) for s, r in rows.items()} == dict.fromkeys(STEPS, "completed")


@pytest.mark.parametrize("strategy", ["FROM_FAILURE", "ALL_STEPS"])
def test_reexecuting_a_run_failed_by_the_provider_pays_only_what_is_missing(
    recovery: Recovery, strategy: str
) -> None:
    """The UI's "Re-execute from failure" runs scene_detail again; "Re-execute all steps" runs all
    four, whose first three judge themselves clean and skip. Either way the re-execution
    pays the two scenes that were never answered: the two paid before the failure are
    taken back from the journal."""
    d = recovery
    partition = f"demo/{strategy.lower().replace('_', '')}"
    episode = d.add_episode(partition)
    d.endpoint.fail_scene()  # until healed
    first = d.launch(partition, STEPS, NO_RETRY)
    _failed_at_scene_detail(d, episode, first)
    d.endpoint.heal()

    second = d.reexecute(first, strategy)
    runs = d.settled(first)
    assert [r.run_id for r in runs] == [first, second]
    assert d.run(second).status.value == "SUCCESS"
    _paid_only_what_was_missing(d, episode, first, second)


def test_run_retries_pay_only_what_is_missing(recovery: Recovery) -> None:
    """The daemon's automatic re-execution (instance default: ``max_retries: 2``) of a run
    the provider failed: one retry, from failure, paying the two missing scenes."""
    d = recovery
    partition = "demo/retried"
    episode = d.add_episode(partition)
    d.endpoint.fail_scene(ATTEMPTS)  # one call's attempts fail; the next call is answered
    first = d.launch(partition, STEPS)
    _failed_at_scene_detail(d, episode, first)
    runs = d.settled(first)
    assert len(runs) == 2, [(r.run_id, r.status.value) for r in runs]
    retry = runs[1]
    assert retry.tags.get("dagster/retry_number") == "1"
    assert retry.status.value == "SUCCESS"
    _paid_only_what_was_missing(d, episode, first, retry.run_id)


def test_a_block_is_not_retried_and_a_button_pays_nothing(recovery: Recovery) -> None:
    """A hand-edited checkpoint blocks its step. Run retries (the run's own
    ``dagster/max_retries: 3``) must not relaunch the blocked run; each button pressed on
    it launches one run, which blocks again with no provider call and is not retried
    either."""
    d = recovery
    partition = "demo/blocked"
    episode = d.add_episode(partition)
    clean = d.ended(d.launch(partition, STEPS))
    assert clean.status.value == "SUCCESS"
    spent = d.ledger.episode_calls(episode.project_id, episode.episode_id)
    path = d.checkpoint(episode, "world_guide")
    edited = json.loads(path.read_text())
    edited["data"]["tone"] = "hopeful"  # an editor's change: the content hash no longer holds
    path.write_text(json.dumps(edited, indent=2))

    blocked = d.launch(partition, STEPS[2:], {"dagster/max_retries": "3"})
    runs = d.settled(blocked)
    assert [r.run_id for r in runs] == [blocked], [(r.run_id, r.status.value) for r in runs]
    assert d.run(blocked).status.value == "FAILURE"
    assert d.failure_code(blocked) == "step.resume_blocked"
    assert d.run(blocked).tags.get("dagster/will_retry") == "false"
    said = d.run(blocked).tags.get("resume/run_retries")
    assert said == f"stopped by world_guide [step.resume_blocked] in run {blocked}"
    for strategy in ("FROM_FAILURE", "ALL_STEPS"):
        again = d.reexecute(blocked, strategy)
        assert d.ended(again).status.value == "FAILURE"
        assert d.failure_code(again) == "step.resume_blocked"
    runs = d.settled(blocked)
    assert len(runs) == 3, [(r.run_id, r.status.value, r.parent_run_id) for r in runs]
    assert d.ledger.episode_calls(episode.project_id, episode.episode_id) == spent


def test_the_spend_cap_is_not_retried_and_raised_pays_only_what_is_missing(
    recovery: Recovery,
) -> None:
    """An episode capped at four calls stops in scene_detail ``[budget.exhausted]`` after
    its second scene. Run retries (instance default) must not relaunch it; once the cap is
    raised, "Re-execute from failure" pays the two missing scenes, and that run, which
    inherits the parent's tags, is again one run retries would retry."""
    d = recovery
    partition = "capped/ep01"
    episode = d.add_episode(partition)
    first = d.launch(partition, STEPS)
    runs = d.settled(first)
    assert [r.run_id for r in runs] == [first], [(r.run_id, r.status.value) for r in runs]
    assert d.run(first).status.value == "FAILURE"
    assert d.failure_code(first) == "budget.exhausted"
    assert d.calls_by_step(episode) == {**CLEAN, "scene_detail": 2}
    assert d.run(first).tags.get("dagster/will_retry") == "false"
    said = d.run(first).tags.get("resume/run_retries")
    assert said == f"stopped by scene_detail [budget.exhausted] in run {first}"

    d.project("capped", budget={"max_calls_per_episode": 200})
    try:
        second = d.reexecute(first, "FROM_FAILURE")
        assert d.ended(second).status.value == "SUCCESS"
    finally:
        d.project("capped", budget={"max_calls_per_episode": 4})
    assert d.calls_by_run(episode) == {first: 4, second: 2}
    assert d.ledger.episode_calls(episode.project_id, episode.episode_id) == 6
    # It inherited the stop with its parent's tags, and took it back at its start.
    assert d.run(second).tags.get("dagster/retry_on_asset_or_op_failure", "true") == "true"


def test_a_backfill_reexecuted_pays_only_its_failed_partitions(recovery: Recovery) -> None:
    """A backfill of three episodes: one fails on the provider, one on the spend cap, one
    completes. The backfill page's "Re-execute" (from failure) is a new backfill of the
    failed partitions: the provider's pays its two missing scenes, the capped one blocks
    again paying nothing, the completed one is not launched."""
    d = recovery
    failing, capped, fine = "demo/bf01", "capped/bf02", "demo/bf03"
    episodes = {
        failing: d.add_episode(failing),
        capped: d.add_episode(capped),
        fine: d.add_episode(fine, story="ep02"),  # no "Tobin on the Water" scene
    }
    d.endpoint.fail_scene()
    first = d.backfill(list(episodes), STEPS, NO_RETRY)
    d.wait("the backfill to end", lambda: _backfill_ended(d, first), timeout=300)
    d.endpoint.heal()
    calls_before = {pk: d.calls_by_run(ep) for pk, ep in episodes.items()}
    assert sum(calls_before[capped].values()) == 4
    assert d.calls_by_step(episodes[failing]) == {**CLEAN, "scene_detail": 3}

    second = d.reexecute_backfill(first, "FROM_FAILURE")
    d.wait("the re-execution to end", lambda: _backfill_ended(d, second), timeout=300)
    runs = d.instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": second}))
    by_partition = {r.tags["dagster/partition"]: r for r in runs}
    assert set(by_partition) == {failing, capped}, sorted(by_partition)
    assert by_partition[failing].status.value == "SUCCESS"
    assert by_partition[capped].status.value == "FAILURE"
    assert d.failure_code(by_partition[capped].run_id) == "budget.exhausted"
    new = {pk: d.calls_by_run(ep) - calls_before[pk] for pk, ep in episodes.items()}
    assert new == {failing: {by_partition[failing].run_id: 2}, capped: {}, fine: {}}
    time.sleep(RETRY_GRACE_S)
    assert len(d.instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": second}))) == 2


def _backfill_ended(d: Recovery, backfill_id: str) -> bool:
    found = d.instance.get_backfill(backfill_id)
    return found is not None and found.status.value not in ("REQUESTED", "CANCELING")
