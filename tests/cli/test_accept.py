"""``storyboard accept``: an editor's hand edit of a prompt becomes the new truth.

On a real run of the ten storyboard steps (offline models): a prompt edited in
``scene_detail/checkpoint.json`` blocks the step (its content hash no longer matches);
``accept`` re-derives the prompt's sentinel hash, verifies, archives, publishes, seals and
audits it as manual, with no model call; the next run SKIPs ``scene_detail`` and lets the
steps downstream judge themselves. An edit the step cannot make valid is refused naming
the field, with not one byte or row changed.

The same through a Dagster launch tagged ``resume/mode=accept``: the edited step accepts
(no call, audited as manual, its materialization says so), the others judge themselves; a
tagged launch of one step with nothing to accept, or an edit it cannot make valid, fails
typed with not one byte or row changed.

Every test runs on a local home and on S3 (a real moto server) from one fixture, with the
same outcome and the same calls: on a bucket the editor's edit is the envelope object
downloaded, edited and put back.
"""

import json
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from cli_helpers import ledger_dump
from click.testing import CliRunner
from storyboard_support import PARTITION, Env

from pipeline_defs.cli import main
from pipeline_defs.operations.workspace import PARTITIONS_NAME
from resources.checkpoints.envelope import sha256_text

BACKENDS = ("sqlite", "s3")  # ``built`` and ``env`` (tests/conftest.py)


@pytest.fixture(autouse=True)
def dagster_home(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """A Dagster home beside each test's copy of the episode, its partition registered (the
    CLI's commands ask the instance)."""
    if "env" not in request.fixturenames:
        return
    env: Env = request.getfixturevalue("env")
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = dg.DagsterInstance.from_config(str(home))
    instance.add_dynamic_partitions(PARTITIONS_NAME, [PARTITION])
    env.dagster_home = home


def storyboard(env: Env, *args: str) -> tuple[int, dict[str, Any] | str]:
    result = CliRunner().invoke(
        main,
        list(args),
        env={
            "PIPELINE_HOME": str(env.home),
            "PIPELINE_DB_URL": env.db_url,
            "PIPELINE_STORAGE_URL": env.storage_url,
            "DAGSTER_HOME": str(env.dagster_home),
        },
    )
    if "--json" in args:
        return result.exit_code, json.loads(result.stdout)
    return result.exit_code, result.output + (result.stderr or "")


def edit_first_prompt(env: Env, text: str) -> dict[str, Any]:
    def edit(raw: dict[str, Any]) -> None:
        raw["data"]["scenes"][0]["t2i_variations"][0]["t2i_prompt"] = text

    return env.edit_envelope("scene_detail", edit)


def test_an_edited_prompt_is_accepted_with_no_call_and_downstream_judges_itself(
    env: Env,
) -> None:
    edit_first_prompt(env, "a lighthouse at dusk, ink storyboard, edited by hand")
    assert env.judge("scene_detail").action.value == "block"  # the edit is seen
    calls_before = len(env.ledger.provider_calls())
    code, payload = storyboard(
        env, "accept", "--partition", PARTITION, "--step", "scene_detail", "--json"
    )
    assert code == 0, payload
    assert isinstance(payload, dict) and payload["accepted"] is True
    # The field the editor changed, and what the step re-derived from it.
    assert payload["changed"] == ["data.scenes[0].t2i_variations[0].t2i_prompt"]
    assert payload["derived"] == [
        "data.scenes[0].t2i_variations[0].owned_validation.t2i_prompt_hash"
    ]
    assert "shot_dependency_t2i" in payload["downstream"]
    accepted = env.checkpoint("scene_detail")  # loads clean: content hash recomputed
    assert accepted is not None
    variation = accepted.data["scenes"][0]["t2i_variations"][0]
    assert variation["owned_validation"]["t2i_prompt_hash"] == sha256_text(variation["t2i_prompt"])
    assert accepted.mutations[-1]["by_step"] == "manual"
    assert Path(payload["archived"]).is_file()  # the edited file as it was, kept
    assert len(env.ledger.provider_calls()) == calls_before  # no model call
    audit = [t for t in env.ledger.transitions() if t.action == "accepted"]
    assert len(audit) == 1 and audit[0].origin == "manual"
    assert env.judge("scene_detail").action.value == "skip"
    # The next run keeps the edit: scene_detail SKIPs, its consumers judge themselves.
    outcome = env.materialize()
    assert outcome.decisions["scene_detail"] == "skip"
    assert outcome.calls_of("scene_detail") == 0
    after = env.checkpoint("scene_detail")
    assert after is not None
    assert after.data["scenes"][0]["t2i_variations"][0]["t2i_prompt"].endswith("by hand")


def test_an_accepted_prompt_reaches_its_picture_and_only_it(env: Env) -> None:
    """The accepted words are what the shot is drawn from: the image step redraws exactly the
    pictures whose prompt changed (one call each) and keeps every other; ``decide`` names them
    before the run."""
    raw = edit_first_prompt(env, "a lighthouse at dusk, ink storyboard, edited by hand")
    scene = raw["data"]["scenes"][0]
    edited = f"S{scene['scene_index']}_L0_V0"
    code, payload = storyboard(env, "accept", "--partition", PARTITION, "--step", "scene_detail")
    assert code == 0, payload
    decision = env.judge("scene_image_pipeline")
    assert decision.action.value == "rerun_self", decision
    assert edited in decision.reason and "older prompt" in decision.reason, decision.reason
    # Nothing is missing: the picture's input changed (not "artifacts are missing").
    assert decision.origin is not None and decision.origin.value == "input_changed", decision
    assert "missing" not in decision.reason, decision.reason
    before = env.checkpoint("scene_image_pipeline")
    assert before is not None
    page = env.root / "sheet.html"
    code, sheet = storyboard(
        env, "sheet", "--partition", PARTITION, "--out", str(page), "--json"
    )  # fmt: skip
    assert code == 0 and isinstance(sheet, dict), sheet
    assert sheet["outdated"] == [f"scene_image_pipeline/{edited}"], sheet
    assert "drawn from an older prompt" in page.read_text(encoding="utf-8")

    outcome = env.materialize()

    assert outcome.decisions["scene_image_pipeline"] == "rerun_self"
    assert outcome.calls_of("scene_image_pipeline") == 1
    for step_id in ("ref_image_gen", "composite_image_gen"):
        assert outcome.decisions[step_id] == "skip", step_id
    after = env.checkpoint("scene_image_pipeline")
    assert after is not None
    redrawn = {
        item
        for item, entry in after.data["images"].items()
        if entry["sha256"] != before.data["images"][item]["sha256"]
    }
    assert redrawn == {edited}
    assert env.judge("scene_image_pipeline").action.value == "skip"
    code, sheet = storyboard(env, "sheet", "--partition", PARTITION, "--out", str(page), "--json")
    assert code == 0 and isinstance(sheet, dict) and sheet["outdated"] == [], sheet


def edit_camera_direction(env: Env) -> None:
    """An edit the step cannot make valid: it does not re-derive the hash that covers it."""

    def edit(raw: dict[str, Any]) -> None:
        raw["data"]["scenes"][0]["camera_direction"] = "a camera direction edited by hand"

    env.edit_envelope("scene_detail", edit)


def test_an_edit_the_step_cannot_make_valid_is_refused_and_changes_nothing(env: Env) -> None:
    edit_camera_direction(env)
    before_files, before_rows = env.stored(), ledger_dump(env.db_url)
    code, output = storyboard(env, "accept", "--partition", PARTITION, "--step", "scene_detail")
    assert code == 1
    assert isinstance(output, str) and "[accept.refused]" in output
    assert "camera_direction" in output and "nothing was changed" in output
    assert env.stored() == before_files
    assert ledger_dump(env.db_url) == before_rows


def test_an_unedited_checkpoint_has_nothing_to_accept(env: Env) -> None:
    before_rows = ledger_dump(env.db_url)
    code, payload = storyboard(
        env, "accept", "--partition", PARTITION, "--step", "entity_t2i", "--json"
    )
    assert code == 0 and isinstance(payload, dict) and payload["accepted"] is False
    assert ledger_dump(env.db_url) == before_rows


def _decided(env: Env, step_id: str) -> dict[str, Any]:
    code, payload = storyboard(env, "decide", "--partition", PARTITION, "--json")
    assert code == 0 and isinstance(payload, dict), payload
    (decision,) = [d for d in payload["decisions"] if d["step"] == step_id]
    return dict(decision)


def test_decide_names_a_changed_victim_not_a_missing_artifact(env: Env) -> None:
    """A hand edit of scene_detail, a victim of the review: nothing of t2i_review is missing.
    ``decide`` names the cause, the victim that no longer holds the review's result (origin
    ``victim_changed``), while the edit waits and once it is accepted (the review runs again)."""
    edit_first_prompt(env, "a lighthouse at dusk, edited by hand")
    review = _decided(env, "t2i_review")
    assert review["origin"] == "victim_changed", review
    assert "missing" not in review["reason"] and "scene_detail" in review["reason"], review
    assert review["verdict"] == "waiting"  # on the blocked edit: accept or force
    code, payload = storyboard(env, "accept", "--partition", PARTITION, "--step", "scene_detail")
    assert code == 0, payload
    review = _decided(env, "t2i_review")
    assert (review["action"], review["origin"]) == ("rerun_self", "victim_changed"), review
    assert "missing" not in review["reason"], review
    assert "scene_detail: changed since t2i_review reviewed it" in review["reason"], review


def test_the_block_of_a_hand_edit_offers_accept_before_force(env: Env) -> None:
    edit_first_prompt(env, "a lighthouse at dusk, edited by hand")
    code, payload = storyboard(env, "status", "--partition", PARTITION, "--json")
    assert code == 0, payload
    assert isinstance(payload, dict)
    (state,) = [s for s in payload["steps"] if s["step"] == "scene_detail"]
    assert state["verdict"] == "blocked"
    hint = state["what_to_do"]
    assert hint.startswith(f"keep the edit: storyboard accept --partition {PARTITION}"), hint
    assert "storyboard force" in hint  # discarding it stays possible


def test_materialize_launches_no_step_that_can_only_wait_on_a_blocked_one(env: Env) -> None:
    from pipeline_defs.steps.graph import StepGraph
    from pipeline_defs.storyboard import STORYBOARD_STEPS

    edit_first_prompt(env, "a lighthouse at dusk, edited by hand")
    waits = set(StepGraph(STORYBOARD_STEPS).downstream("scene_detail"))
    assert waits  # the test means something only if scene_detail has dependents
    code, payload = storyboard(env, "materialize", "--partition", PARTITION, "--json")

    assert code == 1 and isinstance(payload, dict)
    outcomes = {s["step"]: s for s in payload["steps"]}
    assert outcomes["scene_detail"]["outcome"] == "failed"
    assert outcomes["scene_detail"]["error_code"] == "step.resume_blocked"
    assert "storyboard accept" in outcomes["scene_detail"]["next_step"]
    assert "next: keep the edit: storyboard accept" in payload["error"]["message"]
    assert {s for s, o in outcomes.items() if o["outcome"] == "waiting"} == waits
    for step_id in waits:
        assert "waits on blocked upstream" in outcomes[step_id]["error"]
    # Dagster recorded no failure for the steps that were never going to run.
    instance = dg.DagsterInstance.from_config(str(env.dagster_home))
    run = instance.get_run_by_id(payload["run_id"])
    assert run is not None
    planned = {key.path[-1] for key in run.asset_selection or ()}
    assert planned.isdisjoint(waits) and "scene_detail" in planned


def test_materialize_of_a_step_behind_a_block_says_what_to_do(env: Env) -> None:
    edit_first_prompt(env, "a lighthouse at dusk, edited by hand")
    code, payload = storyboard(
        env, "materialize", "--partition", PARTITION, "--step", "t2i_review", "--json"
    )
    assert code == 1 and isinstance(payload, dict)
    (only,) = payload["steps"]
    assert (only["step"], only["outcome"]) == ("t2i_review", "waiting")
    assert payload["error"]["code"] == "step.gate_blocked"
    assert "scene_detail: next: keep the edit: storyboard accept" in payload["error"]["message"]


# --------------------------------------------------------------------- tag resume/mode=accept
# The same accept from a Dagster launch (UI launchpad, GraphQL, backfill): the run tag
# resume/mode=accept (docs/DESIGN.md#hand-edits). Real launches through dg.materialize.
ACCEPT_TAG = {"resume/mode": "accept"}


def test_launch_modes_from_tags() -> None:
    from pipeline_defs.resume.decision_types import LaunchMode
    from pipeline_defs.resume.errors import PipelineError
    from pipeline_defs.wiring.assets import launch_mode

    assert launch_mode(ACCEPT_TAG) is LaunchMode.ACCEPT
    assert launch_mode({"resume/mode": " Accept "}) is LaunchMode.ACCEPT
    assert launch_mode({"resume/mode": "force"}) is LaunchMode.FORCE
    # An unknown value resumes, as a run without the tag: a typo never accepts or forces.
    assert launch_mode({"resume/mode": "accepted"}) is LaunchMode.RESUME
    assert launch_mode({}) is LaunchMode.RESUME
    with pytest.raises(PipelineError) as refused:  # an accept would publish what it redraws
        launch_mode({**ACCEPT_TAG, "resume/redraw": "all"})
    assert refused.value.code == "redraw.invalid"


def test_a_launch_tagged_accept_keeps_the_edit_and_the_other_steps_judge_themselves(
    env: Env,
) -> None:
    from judge_steps import mat_metadata

    from pipeline_defs.steps.graph import StepGraph
    from pipeline_defs.storyboard import STORYBOARD_STEPS

    edit_first_prompt(env, "a lighthouse at dusk, ink storyboard, edited by hand")
    seq = env.ledger.cursor()[0]
    outcome = env.materialize(tags=ACCEPT_TAG)  # the whole partition, as from the launchpad

    assert outcome.result.success
    run_id = outcome.result.run_id
    audit = [t for t in env.ledger.transitions(since_seq=seq) if t.action == "accepted"]
    assert [(t.step_id, t.origin) for t in audit] == [("scene_detail", "manual")]
    assert (audit[0].run_id, audit[0].launch_path) == (f"{run_id}:0", "api")
    assert outcome.calls_of("scene_detail") == 0  # no model call
    metadata = mat_metadata(outcome.result, "scene_detail")
    assert metadata["resume/decision"] == "accepted"
    assert metadata["resume/origin"] == "manual" and metadata["resume/provider_calls"] == 0
    field = "data.scenes[0].t2i_variations[0].t2i_prompt"  # the field the editor changed
    assert metadata["resume/accepted_fields"] == field
    accepted = env.checkpoint("scene_detail")  # loads clean: content hash recomputed
    assert accepted is not None and metadata["checkpoint/content_hash"] == accepted.content_hash
    assert accepted.data["scenes"][0]["t2i_variations"][0]["t2i_prompt"].endswith("by hand")
    assert accepted.mutations[-1]["by_step"] == "manual"
    assert accepted.mutations[-1]["run_id"] == f"{run_id}:0"
    assert env.judge("scene_detail").action.value == "skip"
    # Every other step judged itself, as in an untagged run: its own decision in the ledger
    # and on its materialization, nothing accepted; upstream of the edit all SKIP.
    others = [s.step_id for s in STORYBOARD_STEPS if s.step_id != "scene_detail"]
    assert set(outcome.decisions) == set(others)
    for step_id in others:
        decision = mat_metadata(outcome.result, step_id)["resume/decision"]
        assert decision == outcome.decisions[step_id], step_id
    for step_id in StepGraph(STORYBOARD_STEPS).upstream("scene_detail"):
        assert outcome.decisions[step_id] == "skip" and outcome.calls_of(step_id) == 0


@pytest.mark.parametrize(
    ("edit", "code"),
    [("none", "accept.nothing_published"), ("camera_direction", "accept.refused")],
)
def test_a_launch_tagged_accept_with_nothing_to_accept_fails_typed_and_changes_nothing(
    env: Env, edit: str, code: str
) -> None:
    from judge_steps import failure

    if edit == "camera_direction":
        edit_camera_direction(env)
    before_files, before_rows = env.stored(), ledger_dump(env.db_url)
    outcome = env.materialize(["scene_detail"], tags=ACCEPT_TAG, raise_on_error=False)

    assert not outcome.result.success
    description, metadata = failure(outcome.result, "scene_detail")
    assert metadata["error/code"] == code, description
    assert "nothing was changed" in description
    assert env.stored() == before_files  # not one byte, not one row
    assert ledger_dump(env.db_url) == before_rows
