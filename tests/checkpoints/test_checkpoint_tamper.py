"""Tampering never SKIPs (docs/DESIGN.md#content-hash): a checkpoint.json with no content_hash, or
with a field of the wrong shape, is a typed error naming the file (and the field), so the
judge BLOCKs with ``contract_drift`` instead of passing edited data downstream or crashing
with a bare TypeError. An explicit force still recovers: the bad file is archived, the step
rebuilt.
"""

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from judge_steps import (
    PARTITION,
    STEPS,
    Harness,
    failure,
    make_data,
    rehash_envelope,
    step_key,
    tree_digest,
)

from pipeline_defs.judging.evaluation import evaluate_partitions
from pipeline_defs.judging.stores import Stores
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.decision_types import LaunchMode, ResumeAction, ResumeDecision
from pipeline_defs.resume.errors import PipelineError, status_of
from pipeline_defs.resume.layout import ARCHIVE_DIR
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.steps.judge import StepJudge
from resources.checkpoints.envelope import Artifact, Checkpoint
from resources.pipeline import PipelineResource

SOURCE = "/home/x/checkpoints/proj1/ep1/alpha/checkpoint.json"
FORCE = {"resume/mode": "force"}


# ---------------------------------------------------------------------- unit: from_dict
def envelope() -> dict[str, Any]:
    """A valid envelope as it sits on disk (every field filled, one artifact, one mutation)."""
    return Checkpoint(
        step_id="alpha",
        project_id="proj1",
        episode_id="ep1",
        status=StepStatus.COMPLETED,
        schema_version=1,
        config_hash="c",
        resume_config_keys=("style",),
        config_fingerprints={"style": "fp"},
        project_config_snapshot={"style": "plain"},
        data=make_data(["a", "b"]),
        artifacts=(Artifact(path="out/item0.txt", sha256="0" * 64, bytes=12),),
        produced_by={"run_id": "run-1:0", "started_at": "2026-01-01T00:00:00.000000Z"},
        created_at="2026-01-01T00:00:01.000000Z",
        mutations=({"by_step": "gamma", "run_id": "run-2:0", "fields": ["items"]},),
    ).to_dict()


def load(raw: Any) -> Checkpoint:
    return Checkpoint.from_dict(raw, source=SOURCE)


def test_a_valid_envelope_round_trips() -> None:
    raw = envelope()
    loaded = load(copy.deepcopy(raw))
    assert loaded.to_dict() == raw
    # Typed once loaded; the file holds the text, exactly as before it was typed.
    assert loaded.status is StepStatus.COMPLETED and type(raw["status"]) is str
    assert '\n "status": "completed",\n' in loaded.to_json()


def test_a_missing_content_hash_is_contract_drift_naming_the_file() -> None:
    raw = envelope()
    del raw["content_hash"]
    raw["data"]["items"].append("by hand")  # the edit the missing hash would hide
    with pytest.raises(PipelineError) as caught:
        load(raw)
    error = caught.value
    assert error.origin == Origin.CONTRACT_DRIFT.value
    assert error.code == "io.integrity_violation"
    assert SOURCE in error.message and "content_hash" in error.message
    assert error.details["path"] == SOURCE


@pytest.mark.parametrize("value", [None, 5, ["x"], {"x": 1}])
def test_a_non_string_content_hash_is_a_field_error(value: Any) -> None:
    raw = envelope()
    raw["content_hash"] = value
    with pytest.raises(PipelineError) as caught:
        load(raw)
    error = caught.value
    assert (error.code, error.origin) == ("checkpoint.invalid", Origin.CONTRACT_DRIFT.value)
    assert SOURCE in error.message and "field 'content_hash'" in error.message


def _artifact(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def change(raw: dict[str, Any]) -> None:
        entry = raw["artifacts"][0]
        for name, value in changes.items():
            if value is None:
                del entry[name]
            else:
                entry[name] = value

    return change


def _set(name: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda raw: raw.update({name: value})


# (id, change, field the message must name)
MALFORMED: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("mutations_of_ints", _set("mutations", [1]), "mutations"),
    ("mutations_not_a_list", _set("mutations", "x"), "mutations"),
    ("mutations_an_object", _set("mutations", {"by_step": "gamma"}), "mutations"),
    ("resume_config_keys_int", _set("resume_config_keys", 5), "resume_config_keys"),
    ("resume_config_keys_a_string", _set("resume_config_keys", "style"), "resume_config_keys"),
    ("resume_config_keys_of_ints", _set("resume_config_keys", [1]), "resume_config_keys"),
    ("artifacts_a_string", _set("artifacts", "x"), "artifacts"),
    ("artifacts_of_ints", _set("artifacts", [1]), "artifacts"),
    ("artifact_without_sha256", _artifact(sha256=None), "artifacts"),
    ("artifact_without_path", _artifact(path=None), "artifacts"),
    ("artifact_bytes_a_string", _artifact(bytes="12"), "artifacts"),
    ("artifact_bytes_a_bool", _artifact(bytes=True), "artifacts"),
    ("artifact_bytes_a_float", _artifact(bytes=12.0), "artifacts"),
    ("artifact_sha256_an_int", _artifact(sha256=0), "artifacts"),
    ("produced_by_a_list", _set("produced_by", []), "produced_by"),
    ("data_a_list", _set("data", []), "data"),
    ("data_a_string", _set("data", "x"), "data"),
    ("snapshot_a_list", _set("project_config_snapshot", []), "project_config_snapshot"),
    ("fingerprints_a_list", _set("config_fingerprints", [["a", "b"]]), "config_fingerprints"),
    ("fingerprints_not_text", _set("config_fingerprints", {"style": 1}), "config_fingerprints"),
    ("status_an_int", _set("status", 5), "status"),
    ("status_not_a_step_status", _set("status", "done"), "status"),
    ("status_not_its_exact_text", _set("status", "Completed"), "status"),
    ("step_id_null", _set("step_id", None), "step_id"),
    ("config_hash_a_list", _set("config_hash", ["c"]), "config_hash"),
    ("created_at_an_int", _set("created_at", 5), "created_at"),
]


@pytest.mark.parametrize(
    ("change", "field_name"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_a_malformed_field_is_checkpoint_invalid_naming_file_and_field(
    change: Callable[[dict[str, Any]], None], field_name: str
) -> None:
    raw = envelope()
    change(raw)
    rehash_envelope(raw)  # a consistent tamper: only the shape can catch it
    with pytest.raises(PipelineError) as caught:
        load(raw)
    error = caught.value
    assert error.code == "checkpoint.invalid"
    assert error.origin == Origin.CONTRACT_DRIFT.value
    assert error.status == status_of("checkpoint.invalid") == 422
    assert error.message.startswith(f"checkpoint {SOURCE}: field '{field_name}' must be ")
    assert error.details == {"path": SOURCE, "field": field_name}


WRONG_VALUES: list[Any] = [None, 0, 1.5, True, "x", [], [1], [None], {}, {"k": [1]}]


@pytest.mark.parametrize("name", sorted(envelope()))
def test_no_wrong_value_of_any_field_escapes_as_a_bare_exception(name: str) -> None:
    """Every field, every JSON shape: a Checkpoint or a PipelineError, nothing else."""
    for value in WRONG_VALUES:
        for rehash in (False, True):  # as tampered, and made hash-consistent again
            raw = envelope()
            raw[name] = value
            if rehash and name != "content_hash":
                rehash_envelope(raw)
            try:
                load(raw)
            except PipelineError as exc:
                assert SOURCE in exc.message, (name, value)
                assert exc.origin in {o.value for o in Origin}, (name, value)


# ---------------------------------------------------------------------- through the judge
def _stores(h: Harness) -> Stores:
    """Fresh stores on the harness's home and ledger (no envelope cached from the run)."""
    return Stores.of(PipelineResource(home=str(h.home), db_url=h.db_url, **h.settings))


def _judge(h: Harness) -> ResumeDecision:
    """What a run judges (StepJudge.judge, resume mode), on the live ledger row."""
    stores = _stores(h)
    runtime = StepJudge(
        STEPS[0],
        graph=StepGraph(STEPS),
        settings=stores.settings,
        ledger=stores.ledger,
        checkpoints=stores.checkpoints,
    )
    return runtime.judge(step_key("alpha"), mode=LaunchMode.RESUME, row=h.row("alpha")).decision


def _sensor(h: Harness) -> ResumeDecision:
    """What the resume sensor judges (the batch evaluator, fresh stores: nothing cached)."""
    evaluations = evaluate_partitions(STEPS, _stores(h), [PARTITION], datetime.now(UTC))
    return next(ev.decision for ev in evaluations if ev.step_id == "alpha")


def _write(h: Harness, raw: dict[str, Any]) -> None:
    h.path("alpha").write_text(json.dumps(raw, indent=1))


def drop_hash_and_edit(raw: dict[str, Any]) -> None:
    """An edit the step's own sentinel cannot see (re-sentinelled): only the hash could."""
    del raw["content_hash"]
    raw["data"] = make_data([*raw["data"]["items"], "by hand"])


def mutations_of_ints(raw: dict[str, Any]) -> None:
    raw["mutations"] = [1]
    rehash_envelope(raw)


def produced_by_a_list(raw: dict[str, Any]) -> None:
    raw["produced_by"] = []
    rehash_envelope(raw)


def artifact_bytes_a_string(raw: dict[str, Any]) -> None:
    raw["artifacts"][0]["bytes"] = str(raw["artifacts"][0]["bytes"])
    rehash_envelope(raw)


def status_unknown(raw: dict[str, Any]) -> None:
    raw["status"] = "finished"  # no StepStatus: nothing may judge by it
    rehash_envelope(raw)


def artifacts_a_string(raw: dict[str, Any]) -> None:
    raw["artifacts"] = "x"
    rehash_envelope(raw)


# (tamper, code the downstream input load reports, text the reason must contain)
TAMPERS: list[tuple[Callable[[dict[str, Any]], None], str, str]] = [
    (drop_hash_and_edit, "io.integrity_violation", "content_hash"),
    (mutations_of_ints, "checkpoint.invalid", "field 'mutations'"),
    (produced_by_a_list, "checkpoint.invalid", "field 'produced_by'"),
    (artifact_bytes_a_string, "checkpoint.invalid", "field 'artifacts'"),
    (status_unknown, "checkpoint.invalid", "field 'status'"),
]


def _assert_blocks(decision: ResumeDecision, path: str, text: str) -> None:
    assert decision.action is ResumeAction.BLOCK, decision
    assert decision.origin is Origin.CONTRACT_DRIFT, decision
    assert decision.code == "step.resume_blocked", decision
    assert path in decision.reason and text in decision.reason, decision.reason
    assert "crashed" not in decision.reason


def test_an_unknown_status_on_disk_is_checkpoint_invalid_naming_the_file(h: Harness) -> None:
    """The envelope's status is a StepStatus when loaded, or the load is the typed error."""
    assert h.run("alpha").success
    raw = h.envelope("alpha")
    status_unknown(raw)
    _write(h, raw)
    with pytest.raises(PipelineError) as caught:
        _stores(h).checkpoints.load(step_key("alpha"))
    error = caught.value
    assert (error.code, error.origin) == ("checkpoint.invalid", Origin.CONTRACT_DRIFT.value)
    assert error.details == {"path": str(h.path("alpha")), "field": "status"}
    assert str(h.path("alpha")) in error.message and "'finished'" in error.message


@pytest.mark.parametrize(
    ("tamper", "input_code", "text"), TAMPERS, ids=[t[0].__name__ for t in TAMPERS]
)
def test_a_tampered_checkpoint_blocks_with_contract_drift_naming_the_file(
    h: Harness, tamper: Callable[[dict[str, Any]], None], input_code: str, text: str
) -> None:
    assert h.run("alpha", "beta").success
    raw = h.envelope("alpha")
    tamper(raw)
    _write(h, raw)
    path = str(h.path("alpha"))
    rows = (h.row("alpha"), h.row("beta"))
    files = tree_digest(h.home / "checkpoints")

    # the judge a run calls, and the sensor's batch judge: BLOCK, never SKIP, never a crash
    _assert_blocks(_judge(h), path, text)
    _assert_blocks(_sensor(h), path, text)

    # the step itself in a real run: blocked with the reason, not re-run over the evidence
    own = h.run("alpha")
    assert not own.success
    description, meta = failure(own, "alpha")
    assert meta["error/code"] == "step.resume_blocked"
    assert meta["error/origin"] == "contract_drift"
    assert meta["checkpoint/path"] == path
    assert text in description and "TypeError" not in description

    # downstream: the edited data never reaches the next step
    downstream = h.run("beta")
    assert not downstream.success
    description, meta = failure(downstream, "beta")
    assert meta["error/code"] == input_code
    assert meta["error/origin"] == "contract_drift"
    assert path in description and text in description

    assert len(h.calls("alpha")) == 1 and len(h.calls("beta")) == 1
    assert (h.row("alpha"), h.row("beta")) == rows
    assert tree_digest(h.home / "checkpoints") == files  # nothing deleted, nothing rewritten


@pytest.mark.parametrize(
    "tamper",
    [drop_hash_and_edit, mutations_of_ints, artifacts_a_string],
    ids=lambda t: t.__name__,
)
def test_an_explicit_force_archives_the_bad_file_and_rebuilds(
    h: Harness, tamper: Callable[[dict[str, Any]], None]
) -> None:
    assert h.run("alpha").success
    raw = h.envelope("alpha")
    tamper(raw)
    _write(h, raw)
    evidence = h.path("alpha").read_bytes()

    result = h.run("alpha", tags=FORCE)
    assert result.success, failure(result, "alpha")
    assert len(h.calls("alpha")) == 2
    archived = [p.read_bytes() for p in (h.path("alpha").parent / ARCHIVE_DIR).iterdir()]
    assert evidence in archived  # the bad file is kept as evidence
    rebuilt = h.checkpoints.load(step_key("alpha"))
    assert rebuilt is not None and rebuilt.data == h.envelope("alpha")["data"]
    row = h.row("alpha")
    assert row is not None and row.status == "completed"
    assert _judge(h).action is ResumeAction.SKIP
