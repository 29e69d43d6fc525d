"""The ten storyboard steps with their checkpoints on S3 (moto), PIPELINE_HOME as scratch.

Each "machine" is its own empty ``PIPELINE_HOME`` (inputs aside) sharing only the ledger
and the bucket: what one publishes, another reads, verified against the manifest in the
ledger row. A picture deleted from the bucket is redrawn self-only, one call; an envelope
overwritten in the bucket is a block naming the object; nothing but scratch lands in any
home.
"""

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from counting_storage import counted
from s3_server import S3Server
from storyboard_support import STEP_IDS, Env, scratch_dir, write_episode

from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.layout import SCRATCH_DIR
from pipeline_defs.storyboard import STORYBOARD_STEPS
from resources.checkpoints.manifest import Manifest
from resources.checkpoints.published import scratch_cache_of

PREFIX = "storyboard"


class Machines:
    """Machines on one ledger and one bucket: call it for one more, its ``client`` and
    ``bucket`` to reach the objects behind them."""

    def __init__(self, client: Any, bucket: str, ledger: Path) -> None:
        self.client = client
        self.bucket = bucket
        self.ledger = ledger
        self.made: list[Env] = []

    def __call__(self, inputs: bool = True) -> Env:
        env = Env(scratch_dir("bucket-home"), f"sqlite:///{self.ledger / 'ledger.sqlite3'}")
        env.storage_url = f"s3://{self.bucket}/{PREFIX}"
        if inputs:  # written under this home only (not published): a home of before
            write_episode(env.home)
        self.made.append(env)
        return env


@pytest.fixture
def machines(s3_server: S3Server, aws_env: Callable[[S3Server], None]) -> Iterator[Machines]:
    """Machines on one ledger (SQLite on this host) and one fresh bucket."""
    aws_env(s3_server)
    ledger = scratch_dir("bucket-ledger")
    made = Machines(s3_server.client(), s3_server.new_bucket(), ledger)
    yield made
    for env in made.made:
        shutil.rmtree(env.root, ignore_errors=True)
    shutil.rmtree(ledger, ignore_errors=True)


def manifest(env: Env, step_id: str) -> Manifest:
    row = env.ledger.get(env.key(step_id))
    assert row is not None and row.checkpoint_pointer is not None, step_id
    return Manifest.decode(row.checkpoint_pointer)


def test_a_run_publishes_every_step_to_the_bucket_and_another_machine_skips_it_all(
    machines: Machines,
) -> None:
    first = machines()
    outcome = first.materialize()
    assert outcome.result.success
    assert outcome.total_calls > 0
    client = machines.client
    listed = client.list_objects_v2(Bucket=machines.bucket, Prefix=PREFIX)
    keys = {o["Key"] for o in listed.get("Contents", [])}
    for step_id in STEP_IDS:
        published = manifest(first, step_id)
        assert f"{PREFIX}/{published.envelope.key}" in keys
        for ref in published.artifacts.values():
            assert f"{PREFIX}/{ref.key}" in keys
    # the home holds inputs, the ledger's neighbour and scratch: no checkpoint tree
    assert not (first.home / "checkpoints").exists()
    assert {p.name for p in first.home.iterdir()} <= {"projects", SCRATCH_DIR}

    second = machines()
    again = second.materialize()
    assert again.result.success
    assert again.total_calls == 0
    assert set(again.decisions.values()) == {"skip"}


def test_a_picture_deleted_from_the_bucket_is_redrawn_self_only_on_any_machine(
    machines: Machines,
) -> None:
    first = machines()
    assert first.materialize().result.success
    published = manifest(first, "ref_image_gen")
    relative, ref = sorted(published.artifacts.items())[0]
    client = machines.client
    client.delete_object(Bucket=machines.bucket, Key=f"{PREFIX}/{ref.key}")

    other = machines()
    decision = other.judge("ref_image_gen")
    assert decision.action is ResumeAction.RERUN_SELF
    assert relative in decision.reason
    outcome = other.materialize()
    assert outcome.result.success
    assert outcome.decisions["ref_image_gen"] == "rerun_self"
    assert {s for s, d in outcome.decisions.items() if d != "skip"} == {"ref_image_gen"}
    assert outcome.calls_of("ref_image_gen", "image") == 1  # only the lost picture
    assert outcome.total_calls == 1
    redrawn = manifest(other, "ref_image_gen")
    assert redrawn.artifacts[relative].sha256 == ref.sha256  # offline models are deterministic
    assert redrawn.artifacts[relative].key != ref.key  # a new object, in the new attempt
    kept = {p: r.key for p, r in redrawn.artifacts.items() if p != relative}
    assert kept == {p: r.key for p, r in published.artifacts.items() if p != relative}


def test_an_envelope_overwritten_in_the_bucket_blocks_naming_the_object(
    machines: Machines,
) -> None:
    first = machines()
    assert first.materialize().result.success
    published = manifest(first, "scene_detail")
    client = machines.client
    key = f"{PREFIX}/{published.envelope.key}"
    raw = json.loads(client.get_object(Bucket=machines.bucket, Key=key)["Body"].read())
    raw["data"]["scenes"][0]["t2i_variations"][0]["t2i_prompt"] = "edited in the bucket"
    client.put_object(Bucket=machines.bucket, Key=key, Body=json.dumps(raw).encode())

    other = machines()
    decision = other.judge("scene_detail")
    assert decision.action is ResumeAction.BLOCK
    assert published.envelope.key in decision.reason
    before = other.ledger.get(other.key("scene_detail"))
    outcome = other.materialize(raise_on_error=False)
    assert not outcome.result.success
    assert outcome.total_calls == 0
    assert other.ledger.get(other.key("scene_detail")) == before


def test_home_is_scratch_a_lost_scratch_costs_no_call(machines: Machines, tmp_path: Path) -> None:
    first = machines()
    assert first.materialize().result.success
    for scratch in (first.home / SCRATCH_DIR).iterdir():
        shutil.rmtree(scratch)  # the machine lost its disk
    assert first.materialize().total_calls == 0


def test_gc_deletes_only_old_attempts_that_no_row_names(machines: Machines) -> None:
    from datetime import UTC, datetime, timedelta

    from pipeline_defs.definitions import defs
    from pipeline_defs.operations.garbage import collect_garbage
    from pipeline_defs.operations.workspace import Workspace, steps_of

    first = machines()
    assert first.materialize().result.success
    client = machines.client
    bucket = machines.bucket
    step = f"{PREFIX}/checkpoints/demo/ep01/ref_image_gen"
    orphan = f"{step}/a20200101T000000Z-00000000000000aa"  # a dead, unnamed attempt
    client.put_object(Bucket=bucket, Key=f"{orphan}/refs/C01.png", Body=b"dead")
    named = {ref.key for s in STEP_IDS for ref in manifest(first, s).artifacts.values()}
    ws = Workspace(defs=defs, steps=steps_of(defs), pipeline=first.pipeline)

    young = collect_garbage(ws, grace=timedelta(hours=1))
    assert young.collection.deleted_prefixes == ()  # just written: inside the grace period
    later = datetime.now(UTC) + timedelta(hours=2)
    dry = collect_garbage(ws, grace=timedelta(hours=1), now=later, dry_run=True)
    assert dry.collection.deleted_prefixes == (orphan.removeprefix(f"{PREFIX}/"),)
    assert client.list_objects_v2(Bucket=bucket, Prefix=orphan)["KeyCount"] == 1

    done = collect_garbage(ws, grace=timedelta(hours=1), now=later)
    assert done.collection.deleted_prefixes == dry.collection.deleted_prefixes
    assert client.list_objects_v2(Bucket=bucket, Prefix=orphan)["KeyCount"] == 0
    listed = client.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}/checkpoints")
    present = {o["Key"].removeprefix(f"{PREFIX}/") for o in listed["Contents"]}
    assert named <= present  # everything a row names survives
    assert first.materialize().total_calls == 0


def test_a_foreign_key_under_an_episode_is_skipped_by_judge_run_and_gc(
    machines: Machines, caplog: pytest.LogCaptureFixture
) -> None:
    """Keys obstore cannot parse, planted by another tool under the episode's checkpoints
    and inputs: every machine still judges, runs (nothing to redo) and collects; the keys
    are left in place and named in a warning (failed before: storage.unavailable
    InvalidPathError for the episode and the whole gc)."""
    from datetime import timedelta

    from pipeline_defs.definitions import defs
    from pipeline_defs.operations.garbage import collect_garbage
    from pipeline_defs.operations.workspace import Workspace, steps_of

    first = machines()
    assert first.materialize().result.success
    client = machines.client
    bucket = machines.bucket
    planted = [
        f"{PREFIX}/checkpoints/demo/ep01/../stray.png",
        f"{PREFIX}/checkpoints/demo/ep01/ref_image_gen/./x",
        f"{PREFIX}/projects/demo/episodes/ep01/../notes.txt",
    ]
    for key in planted:
        client.put_object(Bucket=bucket, Key=key, Body=b"not ours")
    other = machines()
    with caplog.at_level("WARNING", logger="resources.storage.object_store"):
        assert other.judge("ref_image_gen").action is ResumeAction.SKIP
        outcome = other.materialize()
        assert outcome.result.success and outcome.total_calls == 0
        ws = Workspace(defs=defs, steps=steps_of(defs), pipeline=other.pipeline)
        assert collect_garbage(ws, grace=timedelta(hours=1)).collection.deleted_prefixes == ()
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert f"{PREFIX}/checkpoints/demo/ep01/../stray.png" in warned
    for key in planted:
        assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == b"not ours"


def test_status_says_where_checkpoints_go_and_that_sqlite_serves_one_machine(
    machines: Machines,
) -> None:
    from pipeline_defs.cli import _storage_line
    from pipeline_defs.definitions import defs
    from pipeline_defs.operations.workspace import Workspace, steps_of

    env = machines()
    line = _storage_line(Workspace(defs=defs, steps=steps_of(defs), pipeline=env.pipeline))
    assert f"published to s3://{machines.bucket}/{PREFIX}" in line
    assert "serves one machine only" in line
    assert "test-secret" not in line and "SeCrEt" not in line


def test_storage_migrate_moves_a_home_into_the_bucket_verified_and_resumable(
    machines: Machines,
) -> None:
    from pipeline_defs.definitions import defs
    from pipeline_defs.operations.storage_migrate import migrate_to
    from pipeline_defs.operations.workspace import Workspace, steps_of

    template = machines()
    local = Env(template.root, template.db_url)  # the same home and ledger, no bucket yet
    assert local.materialize().result.success
    before = local.snapshot()
    broken = local.checkpoint_path("world_guide")
    raw = json.loads(broken.read_text())  # edited by hand: its content hash no longer holds
    raw["data"]["edited"] = True
    broken.write_text(json.dumps(raw))
    url = template.storage_url
    assert url is not None
    ws = Workspace(defs=defs, steps=steps_of(defs), pipeline=local.pipeline)

    report = migrate_to(ws, url)
    assert set(report.skipped) == {str(local.key("world_guide"))}
    assert "broken" in report.skipped[str(local.key("world_guide"))]
    assert len(report.migrated) == len(STEP_IDS) - 1 and report.objects > len(STEP_IDS)
    assert local.snapshot().keys() == before.keys()  # nothing local changed or deleted
    broken_row = local.ledger.get(local.key("world_guide"))
    assert broken_row is not None and broken_row.checkpoint_pointer is None

    again = migrate_to(ws, url)
    assert again.migrated == [] and len(again.already) == len(STEP_IDS) - 1

    other = machines()  # a machine that only has the bucket (and the inputs)
    for step_id in STEP_IDS:
        if step_id != "world_guide":
            assert other.judge(step_id).action is ResumeAction.SKIP, step_id
    # The receipts travelled with the pictures: a migrated image step whose envelope is lost
    # later re-publishes them without a model call, as on the home it came from.
    assert other.manifest("composite_image_gen").companions is not None  # type: ignore[union-attr]
    other.lose_checkpoint("composite_image_gen")
    outcome = other.materialize(["composite_image_gen"])
    assert outcome.decisions == {"composite_image_gen": "rerun_self"}
    assert outcome.total_calls == 0, outcome.calls


def test_inputs_added_on_one_machine_are_read_by_an_empty_one(
    machines: Machines, tmp_path: Path
) -> None:
    """add-episode publishes the story and project.yaml; a machine with an empty home runs
    the whole episode from the bucket, and a third pays nothing."""
    from click.testing import CliRunner

    from pipeline_defs.cli import main
    from pipeline_defs.storyboard import sample_stories

    writer = machines(inputs=False)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    result = CliRunner().invoke(
        main,
        ["add-episode", "--project", "demo", "--episode", "ep01", "--story",
         str(sample_stories()["ep01"]), "--json"],
        env={
            "PIPELINE_HOME": str(writer.home),
            "PIPELINE_DB_URL": writer.db_url,
            "PIPELINE_STORAGE_URL": str(writer.storage_url),
            "DAGSTER_HOME": str(dagster_home),
        },
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    client = machines.client
    listed = client.list_objects_v2(Bucket=machines.bucket, Prefix=f"{PREFIX}/projects")
    assert {o["Key"] for o in listed["Contents"]} == {
        f"{PREFIX}/projects/demo/project.yaml",
        f"{PREFIX}/projects/demo/episodes/ep01/story.md",
    }

    runner = machines(inputs=False)
    assert not (runner.home / "projects").exists()
    outcome = runner.materialize()
    assert outcome.result.success
    assert outcome.total_calls > 0
    assert {r.status for r in runner.ledger.get_many().values()} == {"completed"}
    assert (runner.home / "projects/demo/episodes/ep01/story.md").read_bytes() == (
        writer.home / "projects/demo/episodes/ep01/story.md"
    ).read_bytes()

    third = machines(inputs=False)
    assert third.materialize().total_calls == 0


def test_the_sensors_judgement_on_an_empty_home_reads_the_bucket(
    machines: Machines,
) -> None:
    """What the resume sensor decides, from a machine that holds nothing: every step clean;
    a picture deleted from the bucket launches that one step (self-only)."""
    from datetime import UTC, datetime

    from storyboard_support import PARTITION

    from pipeline_defs.judging.evaluation import evaluate_partitions
    from pipeline_defs.storyboard import STORYBOARD_STEPS

    first = machines()
    assert first.materialize().result.success
    first.checkpoints.publish_inputs("demo", "ep01")  # written under its home only

    def verdicts() -> dict[str, str]:
        sensor = machines(inputs=False)
        judged = evaluate_partitions(
            STORYBOARD_STEPS, sensor.pipeline, [PARTITION], datetime.now(UTC)
        )
        return {ev.step_id: ev.verdict.value for ev in judged}

    assert set(verdicts().values()) == {"skip"}
    ref = sorted(manifest(first, "ref_image_gen").artifacts.values(), key=lambda r: r.key)[0]
    client = machines.client
    client.delete_object(Bucket=machines.bucket, Key=f"{PREFIX}/{ref.key}")
    after = verdicts()
    assert after["ref_image_gen"] == "launch"
    assert {s for s, v in after.items() if v not in ("skip", "waiting")} == {"ref_image_gen"}


def test_the_shared_sheet_reads_the_bucket_from_an_empty_home(
    machines: Machines,
) -> None:
    from storyboard_support import PARTITION

    from pipeline_defs.definitions import defs
    from pipeline_defs.operations.sheet import build_sheet
    from pipeline_defs.operations.workspace import Workspace, steps_of
    from pipeline_defs.resume.partition import Episode

    first = machines()
    assert first.materialize().result.success
    first.checkpoints.publish_inputs("demo", "ep01")
    reader = machines(inputs=False)
    ws = Workspace(defs=defs, steps=steps_of(defs), pipeline=reader.pipeline)
    calls = len(reader.ledger.provider_calls())
    report = build_sheet(ws, Episode.parse(PARTITION))
    assert report.missing_steps == [] and report.problems == []
    shots = len(manifest(first, "scene_image_pipeline").artifacts)
    assert report.shots > 0 and report.pictures >= report.shots
    assert report.html.count("data:image/png;base64,") >= min(shots, report.shots)
    assert len(reader.ledger.provider_calls()) == calls  # no model call


# ---------------------------------------------------------------------------- seals on a bucket
def published_machine(machines: Machines) -> Env:
    """A machine whose inputs are in the bucket before it runs the episode: its rows sealed."""
    first = machines()
    first.checkpoints.publish_inputs("demo", "ep01")
    assert first.materialize().result.success
    return first


def sensor_verdicts(env: Env) -> dict[str, str]:
    from datetime import UTC, datetime

    from storyboard_support import PARTITION

    from pipeline_defs.judging.evaluation import evaluate_partitions
    from pipeline_defs.storyboard import STORYBOARD_STEPS

    judged = evaluate_partitions(STORYBOARD_STEPS, env.pipeline, [PARTITION], datetime.now(UTC))
    return {ev.step_id: ev.verdict.value for ev in judged}


def test_an_unchanged_episode_is_judged_from_the_ledger_with_no_request_per_step(
    machines: Machines,
) -> None:
    """Every completed row carries a seal any machine can check; a machine that holds
    nothing judges the whole episode SKIP with no request for any step (the project
    config aside, which the judge compares itself), and a second look costs nothing."""
    from resources.checkpoints.object_seal import ObjectSeal

    first = published_machine(machines)
    rows = first.ledger.get_many()
    assert {r.status for r in rows.values()} == {"completed"}
    seals = {k.step_id: ObjectSeal.decode(r.checkpoint_seal) for k, r in rows.items()}
    assert all(seals.values()), {s for s, v in seals.items() if v is None}
    assert seals["story_source"].inputs  # type: ignore[union-attr]

    sensor = machines(inputs=False)
    requests = counted(sensor)
    assert set(sensor_verdicts(sensor).values()) == {"skip"}
    assert requests.get("list", 0) == 0, requests
    assert requests.get("get", 0) + requests.get("head", 0) <= 2, requests
    before = dict(requests)
    assert set(sensor_verdicts(sensor).values()) == {"skip"}
    assert requests == before


def test_a_picture_deleted_behind_the_ledger_is_found_by_the_scrub_and_redrawn_self_only(
    machines: Machines,
) -> None:
    """A seal is trusted until the scrub compares the bucket: one LIST of the episode's
    checkpoints and one of its inputs find the deleted picture, clear that one seal in the
    ledger, and from then on every machine relaunches that step alone."""
    from storyboard_support import PARTITION

    from pipeline_defs.judging.scrub import scrub_episodes
    from pipeline_defs.judging.stores import Stores
    from pipeline_defs.resume.partition import Episode

    first = published_machine(machines)
    sensor = machines(inputs=False)
    assert set(sensor_verdicts(sensor).values()) == {"skip"}
    ref = sorted(manifest(first, "ref_image_gen").artifacts.values(), key=lambda r: r.key)[0]
    client = machines.client
    client.delete_object(Bucket=machines.bucket, Key=f"{PREFIX}/{ref.key}")
    # Until the scrub comes round, the seal stands (the latency the period bounds).
    assert set(sensor_verdicts(sensor).values()) == {"skip"}

    requests = counted(sensor)
    report = scrub_episodes(Stores.of(sensor.pipeline), [Episode.parse(PARTITION)], clear=True)
    assert requests == {"list": 2}, requests
    assert [(d.step.step_id, d.why) for d in report.drifts] == [
        ("ref_image_gen", f"missing from the storage: {ref.key.rsplit('/', 2)[-2]}/"
         f"{ref.key.rsplit('/', 1)[-1]}")
    ] or [d.step.step_id for d in report.drifts] == ["ref_image_gen"]  # fmt: skip
    assert report.cleared == 1
    assert first.row_of("ref_image_gen").checkpoint_seal is None
    for judge in (sensor, machines(inputs=False)):
        after = sensor_verdicts(judge)
        assert after["ref_image_gen"] == "launch"
        assert {s for s, v in after.items() if v not in ("skip", "waiting")} == {"ref_image_gen"}
    # A second scrub finds the same drift but clears nothing more (the seal is gone).
    again = scrub_episodes(Stores.of(sensor.pipeline), [Episode.parse(PARTITION)], clear=True)
    assert again.cleared == 0


def test_decide_compares_the_episode_with_the_bucket_before_trusting_seals(
    machines: Machines,
) -> None:
    """``decide``/``status`` of a few episodes scrub them first (no ledger write): an
    overwritten envelope is a block at once, whatever the seal says."""
    from datetime import UTC, datetime

    from pipeline_defs.operations.shadow_decide import judge_now
    from pipeline_defs.operations.workspace import Workspace
    from pipeline_defs.resume.partition import Episode

    first = published_machine(machines)
    envelope = manifest(first, "entity_canon").envelope
    client = machines.client
    client.put_object(Bucket=machines.bucket, Key=f"{PREFIX}/{envelope.key}", Body=b"{}")
    reader = machines(inputs=False)
    assert set(sensor_verdicts(reader).values()) == {"skip"}  # the seal, unscrubbed
    ws = Workspace(defs=dg.Definitions(), steps=STORYBOARD_STEPS, pipeline=reader.pipeline)
    items = judge_now(ws, [Episode("demo", "ep01")], datetime.now(UTC))
    by_step = {i["step"]: i for i in items}
    assert by_step["entity_canon"]["verdict"] == "blocked", by_step["entity_canon"]
    assert envelope.key in by_step["entity_canon"]["reason"], by_step["entity_canon"]
    assert reader.row_of("entity_canon").checkpoint_seal is not None


def test_a_story_replaced_on_one_machine_voids_the_seals_everywhere_at_once(
    machines: Machines, tmp_path: Path
) -> None:
    """add-episode --replace clears the episode's seals with the new story's publish: a
    machine that trusted them judges the long way and blocks story_source (an edited story
    blocks until a force), without waiting for the scrub."""
    from click.testing import CliRunner

    from pipeline_defs.cli import main

    first = published_machine(machines)
    sensor = machines(inputs=False)
    assert set(sensor_verdicts(sensor).values()) == {"skip"}
    story = tmp_path / "story.md"
    story.write_text(
        (first.home / "projects/demo/episodes/ep01/story.md").read_text() + "\nA new scene.\n"
    )
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    result = CliRunner().invoke(
        main,
        ["add-episode", "--project", "demo", "--episode", "ep01", "--story", str(story),
         "--replace", "--json"],
        env={
            "PIPELINE_HOME": str(first.home),
            "PIPELINE_DB_URL": first.db_url,
            "PIPELINE_STORAGE_URL": str(first.storage_url),
            "DAGSTER_HOME": str(dagster_home),
        },
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert all(r.checkpoint_seal is None for r in first.ledger.get_many().values())
    assert sensor_verdicts(sensor)["story_source"] == "blocked"


def test_the_sensor_scrubs_its_share_each_tick_and_relaunches_a_deleted_picture_self_only(
    machines: Machines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real sensor on a machine that holds nothing: ticks trust the seals (no request
    per step); its scrub (here a period short enough to cover the episode every tick)
    finds a picture deleted from the bucket, clears that seal, and the same tick requests
    one run of that one step, which redraws it with one call."""
    from storyboard_support import PARTITION

    from pipeline_defs.definitions import build_resources
    from pipeline_defs.judging.registry import forget_tickers
    from pipeline_defs.wiring.assets import build_step_assets
    from sensors.report import REPORT_JOB
    from sensors.resume_sensor import build_resume_sensor

    monkeypatch.setenv("PIPELINE_SCRUB_PERIOD_SECONDS", "0.001")
    first = published_machine(machines)
    sensor_env = machines(inputs=False)
    sensor = build_resume_sensor(STORYBOARD_STEPS, name="bucket_resume_sensor")
    defs = dg.Definitions(
        assets=build_step_assets(STORYBOARD_STEPS),
        sensors=[sensor],
        resources=build_resources(sensor_env.pipeline),
    )
    forget_tickers()
    cursor: list[str | None] = [None]
    skipped: list[str | None] = []

    def tick() -> list[dg.RunRequest]:
        context = dg.build_sensor_context(
            instance=instance,
            cursor=cursor[0],
            definitions=defs,
            resources={"pipeline": sensor_env.pipeline},
        )
        with dg.partition_loading_context(dynamic_partitions_store=instance):
            result = sensor.evaluate_tick(context)
        cursor[0] = result.cursor
        skipped.append(result.skip_message)
        return [r for r in result.run_requests or [] if r.job_name != REPORT_JOB]

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("episodes", [PARTITION])
        assert tick() == []
        requests = counted(sensor_env)
        assert tick() == []
        assert requests.get("list", 0) <= 2, requests  # the scrub's two LISTs
        # What the first tick copied into its scratch is no change of the partition: the
        # tick after a cold one judges nothing (the scratch is not scanned on a bucket).
        assert "resume tick [unchanged]" in str(skipped[-1]), skipped[-1]
        ref = sorted(manifest(first, "ref_image_gen").artifacts.values(), key=lambda r: r.key)[0]
        client = machines.client
        client.delete_object(Bucket=machines.bucket, Key=f"{PREFIX}/{ref.key}")
        (request,) = tick()
        assert [a.to_user_string() for a in request.asset_selection or ()] == ["ref_image_gen"]
        # The judgement fetched into this process's scratch; that is no change of the
        # partition: the next tick requests nothing more (no second run under a new key).
        assert tick() == []
        outcome = sensor_env.materialize(["ref_image_gen"], tags=request.tags)
        assert outcome.result.success
        assert outcome.total_calls == 1
        assert tick() == []
    forget_tickers()


def test_a_hand_edit_of_an_envelope_object_is_accepted_from_any_machine(
    machines: Machines, tmp_path: Path
) -> None:
    """An editor downloads ``scene_detail``'s envelope, fixes a prompt and puts it back.
    Every machine sees a hand edit (the block offers ``storyboard accept``); an accept from
    an empty home validates it, publishes it as a new attempt (the edited object stays,
    named by the archived pointer), with no model call; the next run anywhere SKIPs it."""
    from datetime import UTC, datetime

    from click.testing import CliRunner

    from pipeline_defs.cli import main
    from pipeline_defs.operations.shadow_decide import judge_now
    from pipeline_defs.operations.workspace import Workspace
    from pipeline_defs.resume.partition import Episode
    from resources.checkpoints.envelope import EDITED_OUTSIDE

    first = published_machine(machines)
    before = manifest(first, "scene_detail")
    client = machines.client
    key = f"{PREFIX}/{before.envelope.key}"
    raw = json.loads(client.get_object(Bucket=machines.bucket, Key=key)["Body"].read())
    raw["data"]["scenes"][0]["t2i_variations"][0]["t2i_prompt"] = "a lighthouse, edited by hand"
    client.put_object(Bucket=machines.bucket, Key=key, Body=json.dumps(raw).encode())

    reader = machines(inputs=False)
    ws = Workspace(defs=dg.Definitions(), steps=STORYBOARD_STEPS, pipeline=reader.pipeline)
    (item,) = [
        i for i in judge_now(ws, [Episode("demo", "ep01")], datetime.now(UTC))
        if i["step"] == "scene_detail"
    ]  # fmt: skip
    assert item["verdict"] == "blocked" and EDITED_OUTSIDE in item["reason"], item
    assert "storyboard accept" in item["what_to_do"], item

    editor = machines(inputs=False)
    calls = len(first.ledger.provider_calls())
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    dg.DagsterInstance.from_config(str(dagster_home)).add_dynamic_partitions(
        "episodes", ["demo/ep01"]
    )
    result = CliRunner().invoke(
        main,
        ["accept", "--partition", "demo/ep01", "--step", "scene_detail", "--json"],
        env={
            "PIPELINE_HOME": str(editor.home),
            "PIPELINE_DB_URL": editor.db_url,
            "PIPELINE_STORAGE_URL": str(editor.storage_url),
            "DAGSTER_HOME": str(dagster_home),
        },
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["accepted"] is True
    assert payload["changed"] == ["data.scenes[0].t2i_variations[0].t2i_prompt"]
    after = manifest(first, "scene_detail")
    assert after.envelope.key != before.envelope.key  # a new attempt; nothing overwritten
    assert before.encode() in first.ledger.archived_pointers(first.key("scene_detail"))
    assert client.get_object(Bucket=machines.bucket, Key=key)["Body"].read()
    assert len(first.ledger.provider_calls()) == calls

    runner = machines(inputs=False)
    outcome = runner.materialize()
    assert outcome.result.success
    assert outcome.decisions["scene_detail"] == "skip"
    assert outcome.calls_of("scene_detail") == 0
    kept = runner.checkpoint("scene_detail")
    assert kept is not None
    assert "edited by hand" in kept.data["scenes"][0]["t2i_variations"][0]["t2i_prompt"]


def test_the_storage_gc_job_collects_as_the_command_does_and_ships_stopped(
    machines: Machines,
) -> None:
    """The daily schedule (stopped by default) runs the ``storage_gc`` job, one core with
    ``storyboard gc``: a young unnamed attempt stays, everything a row names stays, a grace
    below the floor is refused; on a local home the job has nothing to collect and says so."""
    from pipeline_defs.definitions import defs
    from resources.pipeline import PipelineResource
    from sensors.storage_gc import GC_JOB, GC_SCHEDULE

    schedule = defs.resolve_schedule_def(GC_SCHEDULE)
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    first = machines()
    assert first.materialize().result.success
    client = machines.client
    bucket = machines.bucket
    orphan = f"{PREFIX}/checkpoints/demo/ep01/ref_image_gen/a20200101T000000Z-00000000000000ab"
    client.put_object(Bucket=bucket, Key=f"{orphan}/refs/C01.png", Body=b"dead")
    job = defs.resolve_job_def(GC_JOB)
    config = {"ops": {"collect_storage_garbage": {"config": {"grace_hours": 1}}}}
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(
            run_config=config, instance=instance, resources={"pipeline": first.pipeline}
        )
        assert result.success
        # Just written: inside the grace period (the deletion itself is
        # test_gc_deletes_only_old_attempts_that_no_row_names, which can set the clock).
        assert client.list_objects_v2(Bucket=bucket, Prefix=orphan)["KeyCount"] == 1
        assert first.materialize().total_calls == 0  # what the rows name survived
        too_short = {"ops": {"collect_storage_garbage": {"config": {"grace_hours": 0}}}}
        refused = job.execute_in_process(
            run_config=too_short,
            instance=instance,
            resources={"pipeline": first.pipeline},
            raise_on_error=False,
        )
        assert not refused.success
        assert client.list_objects_v2(Bucket=bucket, Prefix=orphan)["KeyCount"] == 1
        local = PipelineResource(home=str(first.root / "local"), db_url=first.db_url)
        assert job.execute_in_process(
            run_config=config, instance=instance, resources={"pipeline": local}
        ).success


def test_redraw_and_force_work_on_a_bucket_from_an_empty_home(
    machines: Machines,
) -> None:
    """A redraw of one picture from a machine that holds nothing draws that one picture
    (one call) into a new attempt, names the other pictures where they are, and archives
    the pointer it replaces; a force of a step rebuilds it and leaves its downstream to
    judge themselves on the next run, which any other empty home completes."""
    first = published_machine(machines)
    before = manifest(first, "ref_image_gen")
    relative = sorted(before.artifacts)[0]
    item = Path(relative).stem
    redrawer = machines(inputs=False)
    outcome = redrawer.materialize(["ref_image_gen"], tags={"resume/redraw": item})
    assert outcome.result.success
    assert outcome.total_calls == 1
    after = manifest(first, "ref_image_gen")
    assert after.artifacts[relative].key != before.artifacts[relative].key
    assert {p: r.key for p, r in after.artifacts.items() if p != relative} == {
        p: r.key for p, r in before.artifacts.items() if p != relative
    }
    assert before.encode() in first.ledger.archived_pointers(first.key("ref_image_gen"))

    forcer = machines(inputs=False)
    forced = forcer.materialize(["entity_t2i"], tags={"resume/mode": "force"})
    assert forced.result.success
    assert forced.calls_of("entity_t2i") > 0
    resumed = machines(inputs=False).materialize()
    assert resumed.result.success
    assert {r.status for r in first.ledger.get_many().values()} == {"completed"}
    assert machines(inputs=False).materialize().total_calls == 0


def test_a_lost_attempt_is_paid_for_once_then_skipped(machines: Machines) -> None:
    """Every object of a step's published attempt gone (deleted by hand, a bucket restored
    without it): the next run redraws the step's pictures once and publishes them; it used
    to bring its working copy to the lost manifest while publishing, deleting what it had
    just drawn, and failed with a FileNotFoundError, paying again on every resume."""
    first = machines()
    assert first.materialize().result.success
    lost = manifest(first, "ref_image_gen")
    client = machines.client
    for ref in (lost.envelope, *lost.artifacts.values()):
        client.delete_object(Bucket=machines.bucket, Key=f"{PREFIX}/{ref.key}")

    second = machines()
    outcome = second.materialize(raise_on_error=False)
    assert outcome.result.success, outcome.decisions
    assert outcome.calls_of("ref_image_gen", "image") == len(lost.artifacts)
    assert outcome.total_calls == len(lost.artifacts)
    third = machines()
    again = third.materialize()
    assert again.result.success and again.total_calls == 0


def _edit_prompt_in_the_bucket(machines: Machines, env: Env, prompt: str) -> None:
    """An editor downloads ``scene_detail``'s published envelope, sets the first prompt and
    puts it back under the same key (a hand edit, as an operator makes it)."""
    client = machines.client
    key = f"{PREFIX}/{manifest(env, 'scene_detail').envelope.key}"
    raw = json.loads(client.get_object(Bucket=machines.bucket, Key=key)["Body"].read())
    raw["data"]["scenes"][0]["t2i_variations"][0]["t2i_prompt"] = prompt
    client.put_object(Bucket=machines.bucket, Key=key, Body=json.dumps(raw).encode())


def _accept(env: Env, dagster_home: Path) -> dict[str, object]:
    from click.testing import CliRunner

    from pipeline_defs.cli import main

    result = CliRunner().invoke(
        main,
        ["accept", "--partition", "demo/ep01", "--step", "scene_detail", "--json"],
        env={
            "PIPELINE_HOME": str(env.home),
            "PIPELINE_DB_URL": env.db_url,
            "PIPELINE_STORAGE_URL": str(env.storage_url),
            "DAGSTER_HOME": str(dagster_home),
        },
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    payload: dict[str, object] = json.loads(result.stdout)
    return payload


def test_every_accept_publishes_even_back_to_content_published_before(
    machines: Machines, tmp_path: Path
) -> None:
    """Edit -> accept -> edit back to the original words -> accept -> edit again
    -> accept. Each accept publishes a new attempt of its own (the attempt id is unique per
    publication, not derived from the content and the first producer), so content equal to
    an earlier publication never collides with that publication's objects (before: the
    accept back failed with ``storage.object_exists`` for good)."""
    first = published_machine(machines)
    original = manifest(first, "scene_detail")
    loaded = first.checkpoint("scene_detail")
    assert loaded is not None
    words = str(loaded.data["scenes"][0]["t2i_variations"][0]["t2i_prompt"])
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    dg.DagsterInstance.from_config(str(dagster_home)).add_dynamic_partitions(
        "episodes", ["demo/ep01"]
    )
    published = [original]
    for prompt in ("a lighthouse, edited by hand", words, "a lighthouse, edited by hand"):
        _edit_prompt_in_the_bucket(machines, first, prompt)
        payload = _accept(machines(inputs=False), dagster_home)
        assert payload["accepted"] is True, payload
        now = manifest(first, "scene_detail")
        assert now.attempt not in {m.attempt for m in published}, (now.attempt, published)
        published.append(now)
        kept = machines(inputs=False).checkpoint("scene_detail")  # verified, any machine
        assert kept is not None
        assert kept.data["scenes"][0]["t2i_variations"][0]["t2i_prompt"] == prompt
    # equal content, distinct publications
    assert published[2].content_hash == original.content_hash
    assert published[3].content_hash == published[1].content_hash
    assert first.judge("scene_detail").action is ResumeAction.SKIP


@pytest.mark.parametrize("scrubbed_by", ["this process", "another process"])
def test_a_long_lived_reader_sees_a_replaced_picture_once_its_seal_is_cleared(
    machines: Machines, scrubbed_by: str
) -> None:
    """A process that read a step (its scratch copy made, verified) keeps judging
    it clean only while the bucket still holds the objects the manifest names. A picture
    replaced behind its back, once the scrub cleared the step's seal, gets the verdict a
    fresh machine gives (a block naming the object), not the scratch copy's SKIP: a scratch
    copy whose bytes match the manifest is not trusted when the object is another one."""
    from storyboard_support import PARTITION

    from pipeline_defs.judging.scrub import scrub_episodes
    from pipeline_defs.judging.stores import Stores
    from pipeline_defs.resume.partition import Episode

    first = published_machine(machines)
    sensor = machines(inputs=False)  # the long-lived process (the sensor's code server)
    assert set(sensor_verdicts(sensor).values()) == {"skip"}
    published = manifest(first, "ref_image_gen")
    assert sensor.checkpoint("ref_image_gen") is not None  # read: a scratch copy, marked
    relative, ref = sorted(published.artifacts.items())[0]
    assert sensor.checkpoints.artifact_path(sensor.key("ref_image_gen"), relative).is_file()
    client = machines.client
    client.put_object(Bucket=machines.bucket, Key=f"{PREFIX}/{ref.key}", Body=b"not the picture")

    scrubber = sensor if scrubbed_by == "this process" else machines(inputs=False)
    report = scrub_episodes(Stores.of(scrubber.pipeline), [Episode.parse(PARTITION)], clear=True)
    assert [d.step.step_id for d in report.drifts] == ["ref_image_gen"]
    assert report.cleared == 1

    fresh = sensor_verdicts(machines(inputs=False))
    assert fresh["ref_image_gen"] != "skip", fresh
    assert sensor_verdicts(sensor)["ref_image_gen"] == fresh["ref_image_gen"]
    decision = sensor.judge("ref_image_gen")
    assert decision.action is ResumeAction.BLOCK, decision
    assert ref.key in decision.reason, decision.reason


def test_gc_reads_the_rows_after_listing_so_a_publication_meanwhile_survives(
    machines: Machines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc lists the whole bucket (seconds on a big one) while runs go on. A step published
    while the listing runs must not lose its objects: the rows are read after the listing,
    right before deleting. Here the listing itself lets another machine redraw a picture of
    ``ref_image_gen``, a new attempt (every object counts as old: ``now`` is two hours on)."""
    from datetime import UTC, datetime, timedelta

    from pipeline_defs.definitions import defs
    from pipeline_defs.operations.garbage import collect_garbage
    from pipeline_defs.operations.workspace import Workspace, steps_of

    first = machines()
    assert first.materialize().result.success
    ws = Workspace(defs=defs, steps=steps_of(defs), pipeline=first.pipeline)
    cache = scratch_cache_of(ws.checkpoints)
    assert cache is not None
    bucket = cache.bucket
    listing = bucket.attempts
    other = machines()

    item = Path(sorted(manifest(first, "ref_image_gen").artifacts)[0]).stem

    def slow_listing() -> Iterator[Any]:
        redrawn = other.materialize(["ref_image_gen"], tags={"resume/redraw": item})
        assert redrawn.total_calls == 1  # a publication while gc was listing: listed with it
        yield from listing()

    monkeypatch.setattr(bucket, "attempts", slow_listing)
    later = datetime.now(UTC) + timedelta(hours=2)
    collect_garbage(ws, grace=timedelta(hours=1), now=later)
    published = manifest(first, "ref_image_gen")
    client = machines.client
    for ref in (published.envelope, *published.artifacts.values()):
        found = client.list_objects_v2(Bucket=machines.bucket, Prefix=f"{PREFIX}/{ref.key}")
        assert found["KeyCount"] == 1, f"gc deleted {ref.key}, which the row names"


def test_gc_refuses_a_grace_below_an_hour(machines: Machines) -> None:
    """An attempt's objects are uploaded before its commit names them: a grace of minutes
    could delete them in between. Below the floor gc refuses, saying why."""
    from datetime import timedelta

    from pipeline_defs.definitions import defs
    from pipeline_defs.operations.garbage import collect_garbage
    from pipeline_defs.operations.workspace import Workspace, steps_of
    from pipeline_defs.resume.errors import PipelineError

    first = machines()
    ws = Workspace(defs=defs, steps=steps_of(defs), pipeline=first.pipeline)
    for grace in (timedelta(0), timedelta(minutes=59)):
        with pytest.raises(PipelineError) as caught:
            collect_garbage(ws, grace=grace)
        assert caught.value.code == "input.invalid"
        assert "at least 1 h" in caught.value.message and "commit" in caught.value.message
