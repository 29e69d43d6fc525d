"""``storyboard seal``: a ledger from before seals gets the seals its runs would have written.

Real runs through the run protocol seed completed rows; their seals are then nulled (a
ledger migrated from before seals). The real CLI seals each row whose checkpoint verifies
clean, compare-and-set on the row as read, with a history line; the sensor's batch judge
then takes the sealed path (no verifier call, no checkpoint read). A checkpoint tampered on
disk is not sealed; a row a run claims (or that changes) between the read and the write is
left alone; checkpoint files are never written. Both databases.
"""

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from s3_server import S3Server
from sensor_steps import SENSOR_STEPS, VERIFY_CALLS, seed, set_row, stores_for, write_input

from pipeline_defs.cli import main
from pipeline_defs.judging.evaluation import BatchJudge
from pipeline_defs.judging.stores import Stores
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.judge import StepJudge
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.published import scratch_cache_of
from resources.checkpoints.store import CheckpointStore
from resources.ledger.audit import AuditAction
from resources.ledger.tables import step_run

PARTITIONS = ("p/e1", "p/e2")
STEPS = tuple(s.step_id for s in SENSOR_STEPS)


def _settle() -> None:
    """Past the filesystem timestamp tick: a racy input directory is never sealed."""
    time.sleep(0.03)


def _seeded(stores: Stores) -> Stores:
    home = stores.checkpoints.home
    (home / "projects" / "p").mkdir(parents=True, exist_ok=True)
    (home / "projects" / "p" / "project.yaml").write_text("style: ink\n")
    for pk in PARTITIONS:
        write_input(home, pk, "story.md", f"# {pk}\n")
        if scratch_cache_of(stores.checkpoints) is not None:  # as `add-episode` does
            stores.checkpoints.publish_inputs(*pk.split("/"))
    _settle()
    for pk in PARTITIONS:
        seed(stores, pk)
    _settle()
    # A ledger migrated from before seals: completed rows, no seal.
    with stores.ledger.engine.begin() as conn:
        assert conn.execute(sa.update(step_run).values(checkpoint_seal=None)).rowcount
    return stores


@pytest.fixture
def stores(db_url: str, pipeline_home: Path) -> Stores:
    return _seeded(stores_for(pipeline_home, db_url, running_timeout_seconds=600))


@pytest.fixture(params=["directory", "s3"])
def bucket_stores(
    request: pytest.FixtureRequest,
    db_url: str,
    pipeline_home: Path,
    tmp_path: Path,
    aws_env: Callable[[S3Server], None],
) -> Stores:
    """Checkpoints published as objects, on a local directory as the storage and on S3 (a
    real moto server): rows name their manifests by commit pointer."""
    if request.param == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        aws_env(server)
        url = f"s3://{server.new_bucket()}/pipeline"
    else:
        url = f"file://{tmp_path / 'bucket'}"
    return _seeded(stores_for(pipeline_home, db_url, running_timeout_seconds=600, storage_url=url))


def _keys() -> list[StepKey]:
    return [Episode.parse(pk).step(s) for pk in PARTITIONS for s in STEPS]


def storyboard(stores: Stores, tmp_path: Path, *args: str) -> Result:
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir(exist_ok=True)
    env = {
        "PIPELINE_HOME": str(stores.checkpoints.home),
        "PIPELINE_DB_URL": stores.ledger.url,
        "DAGSTER_HOME": str(dagster_home),
        "STORYBOARD_DEFS": "sensor_steps:sensor_defs",
    }
    storage = (
        stores.checkpoints.location if scratch_cache_of(stores.checkpoints) is not None else None
    )
    if storage is not None:
        env["PIPELINE_STORAGE_URL"] = storage
    return CliRunner().invoke(main, ["seal", *args], env=env)


def seal_json(stores: Stores, tmp_path: Path, *args: str) -> dict[str, Any]:
    result = storyboard(stores, tmp_path, *args, "--json")
    assert result.exit_code == 0, (result.output, result.stderr, result.exception)
    payload: dict[str, Any] = json.loads(result.stdout)
    return payload


def verifier_calls(stores: Stores) -> int:
    """How many verifier calls the sensor's batch judge makes over every partition."""
    now = datetime.now(UTC) + timedelta(seconds=1)
    judge = BatchJudge(SENSOR_STEPS, stores)
    rows = judge.load_rows(list(PARTITIONS))
    VERIFY_CALLS.clear()
    judge.evaluate(list(PARTITIONS), now, rows)
    return sum(VERIFY_CALLS.values())


def files(home: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(home)): p.read_bytes()
        for p in sorted(home.rglob("*"))
        if p.is_file() and not p.name.startswith("ledger.sqlite3")
    }


def test_unsealed_completed_rows_are_sealed_and_the_sensor_then_takes_the_sealed_path(
    stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert verifier_calls(stores) == len(_keys())  # unsealed: every row judged the long way
    before = files(stores.checkpoints.home)
    payload = seal_json(stores, tmp_path)
    assert payload["ok"] and payload["command"] == "seal"
    assert payload["counts"] == {
        "sealed": len(_keys()),
        "already_sealed": 0,
        "not_clean": 0,
        "changed": 0,
    }
    assert files(stores.checkpoints.home) == before  # no checkpoint file written
    for key in _keys():
        row = stores.ledger.get(key)
        assert row is not None and row.status == StepStatus.COMPLETED
        assert stores.checkpoints.sealed(key, row.checkpoint_seal) is not None, key
        (line,) = [t for t in stores.ledger.transitions(key) if t.action is AuditAction.SEALED]
        assert line.from_status == line.to_status == StepStatus.COMPLETED
        assert line.run_id == row.run_id and line.launch_path == "cli"
    # The batch judge now takes the sealed path: no verifier call, no checkpoint read.
    loads: list[StepKey] = []
    original = CheckpointStore.load

    def counted(self: CheckpointStore, key: StepKey) -> Checkpoint | None:
        loads.append(key)
        return original(self, key)

    monkeypatch.setattr(CheckpointStore, "load", counted)
    assert verifier_calls(stores) == 0 and loads == []
    # Run again: nothing left to seal.
    again = seal_json(stores, tmp_path)
    assert again["counts"]["sealed"] == 0
    assert again["counts"]["already_sealed"] == len(_keys())


def test_rows_on_object_storage_are_sealed_the_same_way(
    bucket_stores: Stores, tmp_path: Path
) -> None:
    stores = bucket_stores
    assert verifier_calls(stores) == len(_keys())
    payload = seal_json(stores, tmp_path)
    assert payload["counts"]["sealed"] == len(_keys()), json.dumps(payload)
    for key in _keys():
        row = stores.ledger.get(key)
        assert row is not None and row.checkpoint_pointer is not None
        assert stores.checkpoints.sealed(key, row.checkpoint_seal) is not None, key
    assert verifier_calls(stores) == 0


def test_one_partition_only(stores: Stores, tmp_path: Path) -> None:
    payload = seal_json(stores, tmp_path, "--partition", "p/e2")
    assert sorted(payload["sealed"]) == sorted(f"p/e2:{s}" for s in STEPS)
    for step_id in STEPS:
        row = stores.ledger.get(Episode.parse("p/e1").step(step_id))
        assert row is not None and row.checkpoint_seal is None


def test_a_checkpoint_tampered_on_disk_is_not_sealed(stores: Stores, tmp_path: Path) -> None:
    key = Episode.parse("p/e1").step("mid")
    checkpoint = stores.checkpoints.load(key)
    assert checkpoint is not None
    artifact = stores.checkpoints.artifact_path(key, checkpoint.artifacts[0].path)
    artifact.write_bytes(b"not what was published")
    before = files(stores.checkpoints.home)
    payload = seal_json(stores, tmp_path)
    assert payload["counts"]["sealed"] == len(_keys()) - 1
    assert list(payload["not_clean"]) == [str(key)]
    row = stores.ledger.get(key)
    assert row is not None and row.checkpoint_seal is None
    assert row.status == StepStatus.COMPLETED
    assert files(stores.checkpoints.home) == before  # the tampered file is left as it is
    assert verifier_calls(stores) == 1  # only the tampered row goes the long way


def _claimed(stores: Stores, key: StepKey) -> None:
    assert stores.ledger.claim(key, "another-run:0")  # a run takes the row meanwhile


def _touched(stores: Stores, key: StepKey) -> None:
    set_row(stores, key, updated_at="2999-01-01T00:00:00.000000+00:00")


@pytest.mark.parametrize("change", [_claimed, _touched], ids=["claimed", "touched"])
def test_a_row_changed_between_read_and_write_is_not_sealed(
    stores: Stores,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[Stores, StepKey], None],
) -> None:
    target = Episode.parse("p/e1").step("src")
    original = StepJudge.judge

    def judged_then_changed(self: StepJudge, key: StepKey, **kwargs: Any) -> Any:
        judgement = original(self, key, **kwargs)
        if key == target:  # a real write to the row after the command read it
            change(stores, key)
        return judgement

    monkeypatch.setattr(StepJudge, "judge", judged_then_changed)
    before = stores.ledger.get(target)
    payload = seal_json(stores, tmp_path)
    assert payload["changed"] == [str(target)]
    assert payload["counts"]["sealed"] == len(_keys()) - 1
    after = stores.ledger.get(target)
    assert after is not None and before is not None
    assert after.checkpoint_seal is None
    assert not [t for t in stores.ledger.transitions(target) if t.action is AuditAction.SEALED]
    if change is _claimed:
        assert after.status == StepStatus.RUNNING and after.run_id == "another-run:0"


def test_a_running_row_is_never_touched(stores: Stores, tmp_path: Path) -> None:
    key = Episode.parse("p/e2").step("end")
    assert stores.ledger.claim(key, "live-run:0")
    running = stores.ledger.get(key)
    payload = seal_json(stores, tmp_path)
    assert str(key) not in payload["sealed"]
    assert payload["counts"]["sealed"] == len(_keys()) - 1
    assert stores.ledger.get(key) == running


@pytest.mark.parametrize("partition", ["not a partition", "p/e9"])
def test_bad_input_is_a_typed_error_naming_the_partition(
    stores: Stores, tmp_path: Path, partition: str
) -> None:
    result = storyboard(stores, tmp_path, "--partition", partition)
    assert result.exit_code == 1
    assert "error: [input." in result.stderr and repr(partition) in result.stderr, result.stderr
    for key in _keys():
        row = stores.ledger.get(key)
        assert row is not None and row.checkpoint_seal is None
