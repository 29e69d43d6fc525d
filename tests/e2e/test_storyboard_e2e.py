"""End-to-end: the ten storyboard assets under real Dagster runs, on a local home and on a
bucket, on SQLite and PostgreSQL.

One behaviour suite over every backend (docs/DESIGN.md#storage): a completed pipeline is
built once per backend (module scope) — a local home on SQLite, on PostgreSQL, and S3 (a
real moto server) with the home as scratch — and every scenario runs on its own copy of it
(files, database and bucket copied), so each test starts from the same state. The accidents
go through backend-neutral helpers of :class:`Env` (a file or an object lost, replaced), and
every test asserts the same outcome and the same provider calls on each backend; a test
that cannot apply to a bucket says why in its body.
"""

import hashlib
import io
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image
from s3_server import S3Server
from storyboard_support import (
    PRE_REVIEW,
    STEP_IDS,
    Env,
    cloned,
    edit_config,
    scratch_dir,
    step_failure_messages,
    write_episode,
)

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.decision_types import ResumeAction
from resources.providers import ImageCall, ImageReply, OfflineImageModel
from resources.providers.base import RETRIES_EXHAUSTED, provider_error

SCENE_DOWNSTREAM = (
    "shot_dependency_t2i",
    "t2i_review",
    "ref_image_gen",
    "composite_image_gen",
    "scene_image_pipeline",
)
IMAGE_STEPS = ("ref_image_gen", "composite_image_gen", "scene_image_pipeline")
BACKENDS = ("sqlite", "postgresql", "s3")  # ``built`` and ``env`` (tests/conftest.py)
# A test whose outcome depends on the storage, not on the ledger: a local home and a bucket.
ONE_LEDGER = pytest.mark.parametrize("built", ["sqlite", "s3"], indirect=True)
COMPOSITE = "composites/C01_O02.png"


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


# ----------------------------------------------------------------------------- templates
@pytest.fixture(scope="module")
def sqlite_pre_review() -> Iterator[Env]:
    """Steps before the review done: the state t2i_review and fail-soft tests start from."""
    env = Env.sqlite(scratch_dir("pre"))
    write_episode(env.home)
    env.first = env.materialize(PRE_REVIEW)
    yield env
    env.destroy()


@pytest.fixture(scope="module")
def s3_pre_review(s3_module: S3Server) -> Iterator[Env]:
    """The same on S3: checkpoints published to a bucket, the home is scratch (and inputs)."""
    env = Env.sqlite(scratch_dir("pre-s3"))
    env.storage_url, env.s3 = f"s3://{s3_module.new_bucket()}/storyboard", s3_module
    write_episode(env.home)
    env.first = env.materialize(PRE_REVIEW)
    yield env
    env.destroy()


@pytest.fixture(params=["sqlite", "s3"])
def pre_review(request: pytest.FixtureRequest) -> Env:
    return request.getfixturevalue(f"{request.param}_pre_review")  # type: ignore[no-any-return]


def _materialized_metadata(result: Any) -> dict[str, dict[str, Any]]:
    out = {}
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        out[materialization.asset_key.path[-1]] = {
            k: getattr(v, "value", v) for k, v in materialization.metadata.items()
        }
    return out


# ----------------------------------------------------------------------------- scenarios
def test_whole_pipeline_builds_every_step(built: Env) -> None:
    assert built.first is not None and built.first.result.success
    rows = built.rows()
    assert {s: r.status for s, r in rows.items()} == dict.fromkeys(STEP_IDS, "completed")
    for step_id in STEP_IDS:
        assert built.judge(step_id).action is ResumeAction.SKIP, step_id

    calls = {s: sum(1 for c in built.ledger.provider_calls(built.key(s))) for s in STEP_IDS}
    scenes = built.checkpoint_of("scene_detail").data
    assert scenes["scene_count"] == 4 and scenes["shot_count"] == 8
    assert calls["story_source"] == 0
    assert calls["scene_detail"] == scenes["scene_count"]  # one text call per scene
    for step_id in (
        "entity_canon",
        "world_guide",
        "entity_t2i",
        "shot_dependency_t2i",
        "t2i_review",
    ):
        assert calls[step_id] == 1, step_id

    refs = built.checkpoint_of("ref_image_gen").data
    assert [s["name"] for s in refs["skipped"]] == ["Pell"]  # 2 mentions < ref_min_mentions 3
    assert sorted(refs["images"]) == ["C01", "C02", "C04"]
    composites = built.checkpoint_of("composite_image_gen").data
    assert sorted(composites["images"]) == ["C01_O01", "C01_O02", "C02_O01"]
    shots = built.checkpoint_of("scene_image_pipeline").data
    assert len(shots["images"]) == scenes["variation_count"] == 8
    assert shots["failed"] == []
    for step_id, data in (
        ("ref_image_gen", refs),
        ("composite_image_gen", composites),
        ("scene_image_pipeline", shots),
    ):
        assert calls[step_id] == len(data["images"]), step_id
        for entry in data["images"].values():
            png = built.read_artifact(step_id, entry["path"])
            assert png is not None and Image.open(io.BytesIO(png)).size == (128, 96)

    review = built.checkpoint_of("t2i_review").data
    assert review["applied"]["scene_detail"] and review["applied"]["entity_t2i"]
    for victim in ("scene_detail", "entity_t2i"):
        mutations = built.checkpoint_of(victim).mutations
        assert [m["by_step"] for m in mutations] == ["t2i_review"]
    # The victims' assets carry an observation naming who mutated them.
    observed = {
        o.asset_key.path[-1]: o.metadata["resume/mutated_by"].value
        for o in built.first.result.asset_observations_for_node("t2i_review")
    }
    assert observed == {"scene_detail": "t2i_review", "entity_t2i": "t2i_review"}


def test_second_run_skips_every_step_with_zero_provider_calls(env: Env) -> None:
    before = env.snapshot()
    outcome = env.materialize()

    assert outcome.result.success
    assert outcome.decisions == dict.fromkeys(STEP_IDS, "skip")
    assert outcome.total_calls == 0
    assert env.snapshot() == before


def test_incident_replay_after_review_fixes_never_reruns_scene_detail(env: Env) -> None:
    """The production incident: the review's edit of scene_detail must not cascade."""
    scene_detail = env.checkpoint("scene_detail")
    assert scene_detail is not None and scene_detail.mutations  # the review edited it
    before = env.snapshot()
    rows_before = env.rows()

    outcome = env.materialize()

    assert outcome.result.success
    for step_id in ("scene_detail", *SCENE_DOWNSTREAM):
        assert outcome.decisions[step_id] == "skip", step_id
    assert outcome.total_calls == 0
    assert env.snapshot() == before
    assert all(r.status == "completed" for r in env.rows().values())
    assert {s: r.updated_at for s, r in env.rows().items()} == {
        s: r.updated_at for s, r in rows_before.items()
    }
    actions = {t.action for t in env.ledger.transitions()}
    assert "invalidate" not in actions and "force_explicit" not in actions
    # Each asset is judged on its own and still yields its checkpoint (docs/DESIGN.md#launch-paths).
    metadata = _materialized_metadata(outcome.result)
    assert set(metadata) == set(STEP_IDS)
    assert {m["resume/decision"] for m in metadata.values()} == {"skip"}
    assert metadata["scene_detail"]["checkpoint/content_hash"] == scene_detail.content_hash


def test_lost_composite_png_costs_exactly_one_image_call(env: Env) -> None:
    sha = env.artifact_sha256("composite_image_gen", COMPOSITE)
    checkpoint = env.checkpoint("composite_image_gen")
    env.lose_artifact("composite_image_gen", COMPOSITE)
    decision = env.judge("composite_image_gen")
    assert decision.action is ResumeAction.RERUN_SELF
    assert decision.origin is Origin.ARTIFACT_MISSING
    assert COMPOSITE in decision.reason

    outcome = env.materialize()

    assert outcome.result.success
    expected = dict.fromkeys(STEP_IDS, "skip") | {"composite_image_gen": "rerun_self"}
    assert outcome.decisions == expected
    assert outcome.calls == {"composite_image_gen": {"image": 1}}
    assert env.artifact_sha256("composite_image_gen", COMPOSITE) == sha
    repaired = env.checkpoint("composite_image_gen")
    assert repaired is not None and checkpoint is not None
    # The same checkpoint (content, configuration, edits); on a bucket its provenance names
    # the repairing run (objects are immutable: the redrawn picture is a new publication).
    assert repaired.identity_hash == checkpoint.identity_hash
    assert (repaired.data, repaired.artifacts) == (checkpoint.data, checkpoint.artifacts)
    if not env.on_bucket:
        assert repaired == checkpoint  # a local home keeps its envelope as it was
    row = env.row("composite_image_gen")
    assert row is not None and row.status == "completed"


def test_lost_ledger_rows_are_adopted_after_verification(env: Env) -> None:
    before = env.snapshot()
    env.delete_rows()
    assert env.rows() == {}

    outcome = env.materialize()

    assert outcome.result.success
    assert outcome.decisions == dict.fromkeys(STEP_IDS, "adopt")
    assert outcome.total_calls == 0
    assert {s: r.status for s, r in env.rows().items()} == dict.fromkeys(STEP_IDS, "completed")
    assert env.snapshot() == before


def test_lost_checkpoints_rerun_exactly_those_steps(env: Env) -> None:
    lost = ("world_guide", "composite_image_gen")
    data_before = {s: env.checkpoint_of(s).data for s in lost}
    for step_id in lost:
        env.lose_checkpoint(step_id)
        decision = env.judge(step_id)
        assert decision.action is ResumeAction.RERUN_SELF
        assert decision.origin is Origin.ARTIFACT_MISSING

    outcome = env.materialize()

    assert outcome.result.success
    assert outcome.decisions == dict.fromkeys(STEP_IDS, "skip") | dict.fromkeys(lost, "rerun_self")
    # The composites are still there (on disk with their receipts, or the bucket's objects):
    # re-publishing them costs no image call; only the lost text checkpoint is regenerated.
    assert outcome.calls == {"world_guide": {"text": 1}}
    for step_id in lost:
        assert env.checkpoint_of(step_id).data == data_before[step_id]


def test_scoped_config_edit_blocks_scene_detail_naming_the_key(env: Env) -> None:
    before = env.snapshot()
    rows_before = env.rows()
    edit_config(env.home, "scenes.shots_per_scene", 3)

    outcome = env.materialize(raise_on_error=False)

    assert not outcome.result.success
    assert outcome.decisions["scene_detail"] == "block"
    for step_id in ("story_source", "entity_canon", "world_guide", "entity_t2i"):
        assert outcome.decisions[step_id] == "skip", step_id
    for step_id in SCENE_DOWNSTREAM:
        assert step_id not in outcome.decisions  # Dagster skipped them: upstream failed
    failures = step_failure_messages(outcome.result)
    assert set(failures) == {"scene_detail"}
    assert "scenes.shots_per_scene" in failures["scene_detail"]
    block = [t for t in env.ledger.transitions(env.key("scene_detail")) if t.action == "block"]
    assert block and block[-1].origin == "contract_drift"
    assert "scenes.shots_per_scene" in (block[-1].reason or "")
    assert outcome.total_calls == 0
    assert env.rows() == rows_before  # a BLOCK changes no ledger row
    assert env.snapshot() == before


def test_explicit_force_of_scene_detail_reruns_it_and_stales_downstream(env: Env) -> None:
    scenes = env.checkpoint_of("scene_detail").data["scene_count"]

    outcome = env.materialize(["scene_detail"], tags={"resume/mode": "force"})

    assert outcome.result.success
    assert outcome.decisions == {"scene_detail": "force_explicit"}
    assert outcome.calls == {"scene_detail": {"text": scenes}}
    rows = env.rows()
    assert rows["scene_detail"].status == "completed"
    for step_id in SCENE_DOWNSTREAM:
        assert rows[step_id].status == "stale", step_id
        assert env.checkpoint(step_id) is None
        assert env.force_cleared(step_id), step_id
    for step_id in ("story_source", "entity_canon", "world_guide", "entity_t2i"):
        assert rows[step_id].status == "completed", step_id
    # The rebuilt scene_detail is the model's raw output again: no review edits yet.
    assert env.checkpoint_of("scene_detail").mutations == ()
    assert env.judge("shot_dependency_t2i").action is ResumeAction.RERUN_SELF


@ONE_LEDGER
def test_config_edit_outside_a_steps_keys_leaves_it_skip(env: Env) -> None:
    edit_config(env.home, "title", "A retitled project")
    edit_config(env.home, "story.max_bytes", 500_000)
    outcome = env.materialize()
    assert outcome.decisions == dict.fromkeys(STEP_IDS, "skip")
    assert outcome.total_calls == 0

    # A key only ref_image_gen lists: it blocks, naming the key; every other step SKIPs.
    edit_config(env.home, "images.ref_min_mentions", 2)
    for step_id in STEP_IDS:
        decision = env.judge(step_id)
        if step_id == "ref_image_gen":
            assert decision.action is ResumeAction.BLOCK
            assert decision.origin is Origin.CONTRACT_DRIFT
            assert "images.ref_min_mentions" in decision.reason
        else:
            assert decision.action is ResumeAction.SKIP, step_id


class FlakyImageModel(OfflineImageModel):
    """Offline images, except calls whose caption mentions ``fail_on`` (an outage)."""

    fail_on: str

    def generate(self, call: ImageCall) -> ImageReply:
        if self.fail_on in call.caption:
            raise provider_error(RETRIES_EXHAUSTED, f"simulated outage for {self.fail_on}")
        return super().generate(call)


def test_shots_missing_a_composite_fail_soft_then_resume_fills_only_them(
    pre_review: Env,
) -> None:
    with cloned(pre_review) as env:
        outcome = env.materialize(image_model=FlakyImageModel(fail_on="C01_O02"))

        assert outcome.result.success  # partial is not a failure
        rows = env.rows()
        assert rows["composite_image_gen"].status == "partial"
        assert rows["scene_image_pipeline"].status == "partial"
        shots = env.checkpoint_of("scene_image_pipeline").data
        failed = {f["item_id"] for f in shots["failed"]}
        scenes = env.checkpoint_of("scene_detail").data["scenes"]
        needing = {
            f"S{e['scene_index']}_L{i}_V0"
            for i, e in enumerate(scenes)
            if {"character_id": "C01", "outlook_id": "O02"}
            in [{k: c[k] for k in ("character_id", "outlook_id")} for c in e["characters"]]
        }
        assert failed == needing and failed
        assert all("C01/O02" in f["reason"] for f in shots["failed"])
        published = env.checkpoint("scene_image_pipeline")
        assert published is not None
        for item in failed:  # never drawn with a wrong or default reference
            assert f"shots/{item}.png" not in {a.path for a in published.artifacts}
        assert len(shots["images"]) == 8 - len(failed)

        resumed = env.materialize()

        assert resumed.decisions["composite_image_gen"] == "rerun_self"
        assert resumed.decisions["scene_image_pipeline"] == "rerun_self"
        assert resumed.calls == {
            "composite_image_gen": {"image": 1},
            "scene_image_pipeline": {"image": len(failed)},
        }
        assert {s: r.status for s, r in env.rows().items()} == dict.fromkeys(STEP_IDS, "completed")


@ONE_LEDGER
def test_offline_pipeline_is_deterministic_across_homes(built: Env) -> None:
    """Same inputs, another home, another launcher: byte-identical data and PNGs (the
    built episode on a local home or on a bucket; the other one on a local home)."""
    other = Env.sqlite(scratch_dir("determinism"))
    try:
        write_episode(other.home)
        other.run_direct()  # the run protocol without Dagster
        for step_id in STEP_IDS:
            a, b = built.checkpoint(step_id), other.checkpoint(step_id)
            assert a is not None and b is not None
            assert a.data == b.data, step_id
            assert a.artifacts == b.artifacts, step_id
            assert a.content_hash == b.content_hash, step_id
        built_files = {k: v for k, v in built.snapshot().items() if k.endswith(".png")}
        other_files = {k: v for k, v in other.snapshot().items() if k.endswith(".png")}
        assert built_files == other_files and len(built_files) == 14
    finally:
        other.destroy()


def test_images_of_a_run_killed_before_publishing_are_reused(env: Env) -> None:
    """A first run that died after drawing some shots leaves pictures (files with receipts,
    or the objects of the bucket) but no checkpoint and a stale row; the recovery draws only
    what is not there any more."""
    step = "scene_image_pipeline"
    images = env.checkpoint_of(step).data["images"]
    kept, lost = list(images)[:3], list(images)[3:]
    for item in lost:
        env.lose_artifact(step, images[item]["path"])
    env.lose_checkpoint(step)
    env.ledger.invalidate([env.key(step)], "simulated crash")  # stale: an auto recovery

    outcome = env.materialize()

    assert outcome.result.success
    assert outcome.decisions[step] == "rerun_self"
    assert outcome.calls == {step: {"image": len(lost)}}
    assert len(kept) > 0
    row = env.row(step)
    assert row is not None and row.status == "completed"


def test_a_receipt_never_vouches_for_changed_bytes(env: Env) -> None:
    step = "scene_image_pipeline"
    images = env.checkpoint_of(step).data["images"]
    first = next(iter(images))
    path = images[first]["path"]
    original = env.read_artifact(step, path)
    assert original is not None
    env.replace_artifact(step, path, original + b"tampered")
    env.lose_checkpoint(step)
    env.ledger.invalidate([env.key(step)], "simulated crash")

    outcome = env.materialize()

    assert outcome.calls == {step: {"image": 1}}
    assert env.artifact_sha256(step, path) == images[first]["sha256"]


def test_a_changed_png_blocks_naming_it_until_moved_away(env: Env) -> None:
    """Replacing the old silent redraw: bytes other than the recorded
    ones block as an edited envelope does, since an older copy put back comes with a
    receipt that would vouch for it. Moved away, the picture is drawn again alone."""
    step = "composite_image_gen"
    sha = env.artifact_sha256(step, COMPOSITE)
    original = env.read_artifact(step, COMPOSITE)
    assert original is not None
    edited = original + b"edited by hand"
    env.replace_artifact(step, COMPOSITE, edited)
    decision = env.judge(step)
    assert decision.action is ResumeAction.BLOCK
    assert decision.origin is Origin.INVARIANT_DRIFT
    assert COMPOSITE in decision.reason

    blocked = env.materialize(raise_on_error=False)

    assert blocked.decisions[step] == "block"
    assert blocked.total_calls == 0
    assert env.read_artifact(step, COMPOSITE) == edited  # the evidence stays where it was

    env.lose_artifact(step, COMPOSITE)  # the operator keeps the edit aside
    outcome = env.materialize()

    assert outcome.calls == {step: {"image": 1}}
    assert env.artifact_sha256(step, COMPOSITE) == sha
