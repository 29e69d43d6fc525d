"""A step a failed run judged and started, whose end never came back, is not "not run".

On the fleet, a worker's pool process killed mid-step (the OOM killer, a SIGKILL) sends no
event of the step back: its task fails ``WorkerLostError`` and the run fails. The step made
its decision and paid for calls under the run's claim, and its row is left running. Before,
``storyboard materialize`` reported it "not run: the run failed (internal, below)" beside
its 5 calls this run (``tests/e2e/test_fleet.py``, a kill after 5 of 8 replies). Now it is
``unfinished``: started, its end never reported; a step the run never judged stays
``not_run``.
"""

import dagster as dg
from storyboard_support import PARTITION, Env, scratch_dir, write_episode

from pipeline_defs.definitions import defs
from pipeline_defs.operations.run_report import Timeline, summarize_run
from pipeline_defs.operations.workspace import Workspace, steps_of


def test_a_judged_step_without_an_end_in_a_failed_run_is_unfinished() -> None:
    env = Env.sqlite(scratch_dir("report-unfinished"))
    try:
        write_episode(env.home)
        ran = env.materialize(("story_source", "entity_canon"))
        run_id = ran.result.run_id
        assert ran.calls_of("entity_canon") == 1
        with dg.instance_for_test() as instance:  # the run's events are not in it: none came
            ws = Workspace(
                defs=defs, steps=steps_of(defs), pipeline=env.pipeline, _instance=instance
            )
            report = summarize_run(
                ws,
                run_id,
                PARTITION,
                ["entity_canon", "world_guide"],
                Timeline(),
                success=False,
                launch_path="cli",
                dagster_status="FAILURE",
            )
            steps = {s.step: s for s in report.steps}
            started, never = steps["entity_canon"], steps["world_guide"]
            assert (started.outcome, started.decision, started.provider_calls) == (
                "unfinished",
                "first_run",
                1,
            )
            assert started.error == (
                "started, its end never reported (its process was lost): the run ended FAILURE"
            )
            assert (never.outcome, never.decision, never.provider_calls) == ("not_run", None, 0)
            assert never.error is not None and never.error.startswith("not run: ")
            # A run still going (its status not an end) claims nothing was lost.
            going = summarize_run(
                ws,
                run_id,
                PARTITION,
                ["entity_canon"],
                Timeline(),
                success=False,
                launch_path="api",
                dagster_status="STARTED",
            )
            assert going.steps[0].outcome == "not_run"
    finally:
        env.destroy()
