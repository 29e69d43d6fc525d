"""One run per partition (docs/DESIGN.md#sensor), on the ten storyboard steps.

A tick requests, per partition, ONE run holding every step that needs work on its own
judgement plus the steps that need work and wait only on steps of that run; a step whose
own checkpoint is valid is never in it for the sake of its upstream, and nothing below a
blocked or deferred step is. The real sensor is evaluated on a Dagster test instance
(``build_sensor_context``); its request is then executed the way the daemon would run it
(same selection and tags) by a real Dagster run, and the next tick must have nothing left.
"""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
from storyboard_support import (
    PARTITION,
    Env,
    edit_config,
    scratch_dir,
    write_episode,
)

from pipeline_defs.definitions import build_resources
from pipeline_defs.judging.registry import forget_tickers
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.storyboard import STORYBOARD_STEPS
from pipeline_defs.wiring.assets import build_step_assets
from resources.providers import TextCall, TextModel, TextReply
from sensors.report import REPORT_JOB, reported
from sensors.resume_sensor import build_resume_sensor

ORDERED = tuple(s.step_id for s in StepGraph(STORYBOARD_STEPS).ordered)
BELOW_ENTITY_T2I = StepGraph(STORYBOARD_STEPS).downstream("entity_t2i")
FORCE = {"resume/mode": "force"}


class _Sensor:
    """The shipped resume sensor over the storyboard steps, with a settable clock."""

    def __init__(self, instance: dg.DagsterInstance, env: Env) -> None:
        self.instance = instance
        self.env = env
        self.now = datetime.now(UTC)
        self.cursor: str | None = None
        self.sensor = build_resume_sensor(STORYBOARD_STEPS, clock=lambda: self.now)
        self.defs = dg.Definitions(
            assets=build_step_assets(STORYBOARD_STEPS),
            sensors=[self.sensor],
            resources=build_resources(env.pipeline),
        )
        self.last: Any = None

    def tick(self) -> list[dg.RunRequest]:
        """One evaluation; the step runs it requests (block reports left out)."""
        context = dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            definitions=self.defs,
            resources={"pipeline": self.env.pipeline},
        )
        with dg.partition_loading_context(dynamic_partitions_store=self.instance):
            self.last = self.sensor.evaluate_tick(context)
        self.cursor = self.last.cursor
        return [r for r in self.last.run_requests or [] if r.job_name != REPORT_JOB]

    def failed_checks(self) -> set[str]:
        evaluations = (r.evaluation() for r in reported(self.last.run_requests or []))
        return {e.asset_key.to_user_string() for e in evaluations if not e.passed}

    def the_run(self) -> tuple[dg.RunRequest, list[str]]:
        """This tick's one request (for the one partition) and its steps."""
        (request,) = self.tick()
        assert request.partition_key == PARTITION
        return request, [a.to_user_string() for a in request.asset_selection or ()]

    def execute(self, request: dg.RunRequest) -> dict[str, str]:
        """Run the request as the daemon would: its selection, its tags. Step → decision."""
        selection = [a.to_user_string() for a in request.asset_selection or ()]
        outcome = self.env.materialize(selection, tags=request.tags)
        assert outcome.result.success
        return outcome.decisions


@pytest.fixture(scope="module")
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as shared:
        shared.add_dynamic_partitions("episodes", [PARTITION])
        yield shared


@pytest.fixture(autouse=True)
def fresh_tickers() -> Iterator[None]:
    """Each test's sensor starts with no memory of another test's episode."""
    forget_tickers()
    yield
    forget_tickers()


def _statuses(env: Env) -> dict[str, str]:
    return {step: str(row.status) for step, row in env.rows().items()}


def test_a_new_episode_is_one_run_of_all_ten_steps(instance: dg.DagsterInstance) -> None:
    """Before: eight ticks, one single-step run each; now one tick, one run, ten steps."""
    forget_tickers()
    env = Env.sqlite(scratch_dir("one-run-new"))
    try:
        write_episode(env.home)
        env.ledger.migrate()
        sensor = _Sensor(instance, env)
        request, steps = sensor.the_run()
        assert steps == list(ORDERED) and len(steps) == 10
        assert request.tags["resume/action"] == "rerun_self"
        assert request.tags["resume/steps"] == "10"
        assert (
            request.run_key == f"resume:story_source+9:{PARTITION}:{request.tags['resume/state']}"
        )
        decisions = sensor.execute(request)
        assert set(decisions) == set(ORDERED)
        assert _statuses(env) == dict.fromkeys(ORDERED, "completed")
        assert sensor.tick() == [] and not sensor.failed_checks()
    finally:
        env.destroy()
        forget_tickers()


def test_a_force_is_settled_by_one_run_of_the_stale_steps(
    instance: dg.DagsterInstance, env: Env
) -> None:
    """The force staled every step below entity_t2i: one run re-runs exactly those."""
    assert env.materialize(["entity_t2i"], tags=FORCE).result.success
    assert {s for s, status in _statuses(env).items() if status == "stale"} == set(BELOW_ENTITY_T2I)
    sensor = _Sensor(instance, env)
    request, steps = sensor.the_run()
    assert steps == [s for s in ORDERED if s in BELOW_ENTITY_T2I]
    assert len(steps) == 4
    assert request.tags["resume/reason"].startswith("auto recovery: invalidated by an explicit")
    decisions = sensor.execute(request)
    assert set(decisions) == set(BELOW_ENTITY_T2I)  # nothing else judged, claimed or audited
    assert _statuses(env) == dict.fromkeys(ORDERED, "completed")
    assert sensor.tick() == [] and not sensor.failed_checks()


class _Down(TextModel):
    """Every call fails (a provider outage)."""

    @property
    def model_name(self) -> str:
        return "down"

    def complete(self, call: TextCall) -> TextReply:
        raise RuntimeError("provider outage")


def test_a_force_that_failed_reruns_the_step_and_its_stale_steps_in_one_run(
    instance: dg.DagsterInstance, env: Env
) -> None:
    """The forced entity_t2i failed after staling its downstream: while its backoff lasts
    nothing is launched; then one run holds entity_t2i and the four stale steps."""
    forced = env.materialize(["entity_t2i"], tags=FORCE, text_model=_Down(), raise_on_error=False)
    assert not forced.result.success
    statuses = _statuses(env)
    assert statuses["entity_t2i"] == "failed"
    assert {s for s in BELOW_ENTITY_T2I if statuses[s] == "stale"} == set(BELOW_ENTITY_T2I)
    sensor = _Sensor(instance, env)
    assert sensor.tick() == []  # entity_t2i deferred: the stale steps wait for it
    sensor.now += timedelta(seconds=env.pipeline.settings().retry_backoff_seconds + 1)
    request, steps = sensor.the_run()
    assert steps == ["entity_t2i", *[s for s in ORDERED if s in BELOW_ENTITY_T2I]]
    assert request.tags["resume/reason"] == "auto recovery from failed"
    assert set(sensor.execute(request)) == {"entity_t2i", *BELOW_ENTITY_T2I}
    assert _statuses(env) == dict.fromkeys(ORDERED, "completed")
    assert sensor.tick() == []


def test_a_clean_step_below_a_rerun_is_not_in_the_run(
    instance: dg.DagsterInstance, env: Env
) -> None:
    """entity_t2i's checkpoint is gone: it re-runs, and so does t2i_review (its victim is
    gone: its own judgement). The image steps below are clean on their own judgement: they
    stay out of the run, and their rows are not touched."""
    env.checkpoint_path("entity_t2i").unlink()
    before = env.rows()
    sensor = _Sensor(instance, env)
    request, steps = sensor.the_run()
    assert steps == ["entity_t2i", "t2i_review"]
    decisions = sensor.execute(request)
    assert set(decisions) == {"entity_t2i", "t2i_review"}
    after = env.rows()
    for step_id in ("ref_image_gen", "composite_image_gen", "scene_image_pipeline"):
        assert after[step_id] == before[step_id], step_id  # not judged, not claimed
    assert sensor.tick() == []


def test_a_blocked_step_keeps_what_is_below_it_out_of_the_run(
    instance: dg.DagsterInstance, env: Env
) -> None:
    """t2i_review is blocked (its scoped config changed): reported, never launched, and
    ref_image_gen below it, which needs work itself, waits. entity_canon and entity_t2i,
    both without a checkpoint, go in one run."""
    edit_config(env.home, "review.required_keywords", ["lantern"])
    for step_id in ("entity_canon", "entity_t2i", "ref_image_gen"):
        env.checkpoint_path(step_id).unlink()
    sensor = _Sensor(instance, env)
    request, steps = sensor.the_run()
    assert steps == ["entity_canon", "entity_t2i"]
    assert sensor.failed_checks() == {"t2i_review"}
    sensor.execute(request)
    assert sensor.tick() == []  # still blocked: nothing below it is launched


def _check_of(sensor: _Sensor, step_id: str) -> dg.AssetCheckEvaluation:
    """The ``resume_integrity`` report of ``step_id`` in the last tick."""
    (found,) = (
        e
        for e in (r.evaluation() for r in reported(sensor.last.run_requests or []))
        if e.asset_key.to_user_string() == step_id
    )
    return found


def test_a_capped_step_is_reported_blocked_not_relaunched_until_the_cap_is_raised(
    instance: dg.DagsterInstance, env: Env
) -> None:
    """Three pictures of scene_image_pipeline are gone and the episode may record one more
    call (cap 24 in the ledger's settings table, 23 spent). The sensor's run draws one and
    is refused the next: the step fails ``budget.exhausted``. Past its backoff the sensor
    launches nothing and reports it blocked with the command that raises the cap; raised,
    the next tick's run pays the two missing pictures. Before: no cap, the run drew all 3
    and no block existed."""
    step = "scene_image_pipeline"
    shots = env.step_dir(step) / "shots"
    for picture in sorted(shots.glob("*.png"))[:3]:
        picture.unlink()
        picture.with_name(picture.name + ".receipt.json").unlink()
    ledger = env.ledger
    assert ledger.episode_calls("demo", "ep01") == 23
    ledger.set_setting("max_calls_per_episode", "24", changed_by="test")
    sensor = _Sensor(instance, env)
    request, steps = sensor.the_run()
    assert steps == [step]
    capped = env.materialize(steps, tags=request.tags, raise_on_error=False)
    assert not capped.result.success
    assert capped.calls == {step: {"image": 1}}  # the second picture was never sent
    assert ledger.episode_calls("demo", "ep01") == 24
    assert str(env.row_of(step).status) == "failed"

    backoff = env.pipeline.settings().retry_backoff_seconds
    sensor.now = datetime.now(UTC) + timedelta(seconds=backoff + 1)  # past the retry's backoff
    assert sensor.tick() == []  # not relaunched
    assert sensor.failed_checks() == {step}
    check = _check_of(sensor, step)
    raise_it = "storyboard settings set max_calls_per_episode 48"
    assert check.description is not None
    assert check.description.startswith("blocked (budget.exhausted")
    assert "recorded 24 provider calls, at its cap of 24" in check.description
    assert raise_it in check.description
    what_to_do = check.metadata["what_to_do"].value
    assert what_to_do == (
        f"raise the cap: {raise_it}; then resume (what is already paid for is kept)"
    )
    assert sensor.tick() == []  # still blocked, still not launched

    ledger.set_setting("max_calls_per_episode", "30", changed_by="test")
    request, steps = sensor.the_run()
    assert steps == [step]
    resumed = env.materialize(steps, tags=request.tags)
    assert resumed.result.success
    assert resumed.calls == {step: {"image": 2}}  # only what was missing
    assert ledger.episode_calls("demo", "ep01") == 26
    assert sensor.tick() == [] and not sensor.failed_checks()
