"""Bad input on disk: every corruption is a typed ``io.integrity_violation`` (or a BLOCK)
naming the file and its origin, through real Dagster runs — and nothing is deleted."""

import json
from collections.abc import Callable
from typing import Any

import dagster as dg
import pytest
from judge_steps import (
    Harness,
    failure,
    make_data,
    rehash_envelope,
    step_key,
    tree_digest,
)

from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.layout import ARCHIVE_DIR
from pipeline_defs.wiring.io_manager import STEP_METADATA_KEY, CheckpointIOManager
from resources.checkpoints.envelope import Checkpoint
from resources.pipeline import PipelineResource


def _edit(h: Harness, change: Callable[[dict[str, Any]], None], *, rehash: bool = True) -> None:
    raw = h.envelope("alpha")
    change(raw)
    h.path("alpha").write_text(json.dumps(rehash_envelope(raw) if rehash else raw))


def corrupt_json(h: Harness) -> None:
    h.path("alpha").write_bytes(b'{"step_id": "alpha", "data": {oops')


def truncated(h: Harness) -> None:
    payload = h.path("alpha").read_bytes()
    h.path("alpha").write_bytes(payload[: len(payload) // 2])


def edited_without_rehash(h: Harness) -> None:
    _edit(h, lambda raw: raw["data"]["items"].append("by hand"), rehash=False)


def tampered_artifact_hash(h: Harness) -> None:
    def change(raw: dict[str, Any]) -> None:
        raw["artifacts"][0]["sha256"] = "0" * 64

    _edit(h, change)


def tampered_artifact_file(h: Harness) -> None:
    artifact = h.path("alpha").parent / h.envelope("alpha")["artifacts"][0]["path"]
    artifact.write_bytes(artifact.read_bytes() + b" tampered")


def unknown_schema_version(h: Harness) -> None:
    _edit(h, lambda raw: raw.update(schema_version=99))


def non_integer_schema_version(h: Harness) -> None:
    _edit(h, lambda raw: raw.update(schema_version="v1"))


def missing_fields(h: Harness) -> None:
    def change(raw: dict[str, Any]) -> None:
        del raw["produced_by"], raw["mutations"]

    _edit(h, change)


def directory_replaced_by_file(h: Harness) -> None:
    step_dir = h.path("alpha").parent
    step_dir.rename(step_dir.with_name("alpha.moved-aside"))
    step_dir.write_text("not a directory")


# (corruption, origin seen by the step's own judge, origin seen by a downstream input load,
#  text the error must contain)
CASES = [
    (corrupt_json, "contract_drift", "contract_drift", "is not valid JSON"),
    (truncated, "contract_drift", "contract_drift", "is not valid JSON"),
    (edited_without_rehash, "invariant_drift", "invariant_drift", "content hash"),
    (tampered_artifact_hash, "invariant_drift", "invariant_drift", "sha256 mismatch"),
    (tampered_artifact_file, "invariant_drift", "invariant_drift", "sha256 mismatch"),
    (unknown_schema_version, "contract_drift", "contract_drift", "schema_version 99"),
    (non_integer_schema_version, "contract_drift", "contract_drift", "'v1' is not an integer"),
    (missing_fields, "contract_drift", "contract_drift", "missing fields"),
    (directory_replaced_by_file, "contract_drift", "contract_drift", "is a file where"),
]


@pytest.mark.parametrize(
    ("corrupt", "own_origin", "input_origin", "text"), CASES, ids=[c[0].__name__ for c in CASES]
)
def test_corrupt_checkpoint_is_a_typed_error_naming_path_and_origin(
    h: Harness,
    corrupt: Callable[[Harness], None],
    own_origin: str,
    input_origin: str,
    text: str,
) -> None:
    assert h.run("alpha", "beta").success
    corrupt(h)
    path = str(h.path("alpha"))
    rows = (h.row("alpha"), h.row("beta"))
    files = tree_digest(h.home / "checkpoints")

    # downstream: the IO manager refuses to hand the value on
    downstream = h.run("beta")
    assert not downstream.success
    description, meta = failure(downstream, "beta")
    assert meta["error/code"] == "io.integrity_violation"
    assert meta["error/origin"] == input_origin
    assert f"origin: {input_origin}" in description
    assert path in description and meta["checkpoint/path"] == path
    assert text in description

    # the step itself: judged, blocked with the reason, never re-run over the evidence
    own = h.run("alpha")
    assert not own.success
    description, meta = failure(own, "alpha")
    assert meta["error/code"] == "step.resume_blocked"
    assert meta["error/origin"] == own_origin
    assert meta["checkpoint/path"] == path
    assert text in description

    assert len(h.calls("alpha")) == 1 and len(h.calls("beta")) == 1
    assert (h.row("alpha"), h.row("beta")) == rows
    assert tree_digest(h.home / "checkpoints") == files  # nothing deleted, nothing rewritten


def test_store_load_errors_carry_code_origin_and_path(h: Harness) -> None:
    assert h.run("alpha").success
    for corrupt, origin in (
        (truncated, "contract_drift"),
        (missing_fields, "contract_drift"),
        (edited_without_rehash, "invariant_drift"),
    ):
        backup = h.path("alpha").read_bytes()
        corrupt(h)
        with pytest.raises(PipelineError) as caught:
            h.checkpoints.load(step_key("alpha"))
        assert caught.value.code == "io.integrity_violation"
        assert caught.value.origin == origin
        assert caught.value.details["path"] == str(h.path("alpha"))
        assert str(h.path("alpha")) in caught.value.message
        h.path("alpha").write_bytes(backup)


def test_a_replaced_corrupt_checkpoint_is_archived_not_destroyed(h: Harness) -> None:
    assert h.run("alpha").success
    h.knobs("alpha", fail="all")
    # a forced rebuild that fails: the row is failed, the old checkpoint is still there
    assert not h.run("alpha", tags={"resume/mode": "force"}).success
    row = h.row("alpha")
    assert row is not None and row.status == "failed"
    h.knobs("alpha", fail=None)
    corrupt_json(h)
    evidence = h.path("alpha").read_bytes()

    # Row failed: the resume blocks as on a completed row instead of re-running over the
    # corrupt file.
    blocked = h.run("alpha")
    assert not blocked.success
    description, _ = failure(blocked, "alpha")
    assert "step.resume_blocked" in description and str(h.path("alpha")) in description
    assert h.path("alpha").read_bytes() == evidence
    row = h.row("alpha")
    assert row is not None and row.status == "failed"

    result = h.run("alpha", tags={"resume/mode": "force"})  # only a force rebuilds over it
    assert result.success
    assert h.envelope("alpha")["status"] == "completed"
    archived = [p.read_bytes() for p in (h.path("alpha").parent / ARCHIVE_DIR).iterdir()]
    assert evidence in archived


def test_a_body_returning_corrupt_data_publishes_nothing(h: Harness) -> None:
    h.knobs("alpha", corrupt=True)
    result = h.run("alpha")
    assert not result.success
    description, _ = failure(result, "alpha")
    assert "io.integrity_violation" in description and "items_hash" in description
    assert not h.path("alpha").exists()
    row = h.row("alpha")
    assert row is not None and row.status == "failed"


def test_io_manager_output_side_refuses_corrupt_data_and_skips_identical(
    h: Harness, db_url: str
) -> None:
    assert h.run("alpha").success
    manager = CheckpointIOManager(pipeline=PipelineResource(home=str(h.home), db_url=db_url))
    current = h.checkpoints.load(step_key("alpha"))
    assert current is not None
    before = h.snapshot("alpha")

    def context() -> dg.OutputContext:
        return dg.build_output_context(
            asset_key="alpha",
            partition_key="proj1/ep1",
            definition_metadata={STEP_METADATA_KEY: "judge_steps:Alpha"},
        )

    manager.handle_output(context(), current)  # identical content: a no-op on disk
    assert h.snapshot("alpha") == before
    bad = current.with_changes(data={**make_data(["a"]), "items": ["b"]})
    with pytest.raises(dg.Failure) as caught:
        manager.handle_output(context(), bad)
    assert caught.value.metadata["error/code"].value == "io.integrity_violation"
    assert caught.value.metadata["error/origin"].value == "invariant_drift"
    assert str(h.path("alpha")) in str(caught.value.description)
    assert h.snapshot("alpha") == before
    not_a_checkpoint: object = {"data": {}}
    with pytest.raises(dg.Failure, match="not a checkpoint envelope"):
        manager.handle_output(context(), not_a_checkpoint)  # type: ignore[arg-type]
    assert isinstance(current, Checkpoint)
