"""Checkpoint seals: a clean publish seals its files; any change voids the seal; sealed and
unsealed judgements agree. Real runs through the run protocol, both databases."""

import hashlib
import os
import random
import shutil
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from checkpoint_support import stored_row
from sensor_steps import (
    SENSOR_STEPS,
    VERIFY_CALLS,
    Mid,
    delete_row,
    seed,
    set_row,
    stores_for,
    write_input,
)

from pipeline_defs.judging.evaluation import BatchJudge
from pipeline_defs.judging.stores import Stores
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import StepStatus
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.seal import ABSENT, Seal, SealedFile, identity_of, make_seal
from resources.checkpoints.store import CheckpointStore

STEPS = tuple(s.step_id for s in SENSOR_STEPS)


@pytest.fixture
def stores(db_url: str, pipeline_home: Path) -> Stores:
    return stores_for(pipeline_home, db_url, running_timeout_seconds=600)


def _key(pk: str, step_id: str) -> StepKey:
    return Episode.parse(pk).step(step_id)


def _seal_text(stores: Stores, key: StepKey) -> Any:
    row = stores.ledger.get(key)
    assert row is not None
    return row.checkpoint_seal


def _settle() -> None:
    """Let the filesystem timestamp tick pass: files written just before a seal are racy
    (a racy directory is not sealed at all), files written just after must look changed."""
    time.sleep(0.03)


def _step_dir(stores: Stores, pk: str, step_id: str) -> Path:
    return stores.checkpoints.step_dir(_key(pk, step_id))


# --------------------------------------------------------------------------- writing
def test_a_clean_run_seals_its_row_with_what_it_verified(stores: Stores) -> None:
    write_input(stores.checkpoints.home, "p/e1", "story.md", "# once\n")
    _settle()
    seed(stores, "p/e1")
    for step_id in STEPS:
        key = _key("p/e1", step_id)
        seal = Seal.decode(_seal_text(stores, key))
        checkpoint = stores.checkpoints.load(key)
        assert seal is not None and checkpoint is not None
        assert seal.summary == checkpoint.summary()
        assert seal.version == checkpoint.version
        assert seal.artifacts == tuple(a.path for a in checkpoint.artifacts)
        assert seal.checkpoint == identity_of(stores.checkpoints.path_for(key))
        covered = set(seal.paths())
        assert {
            f"checkpoints/p/e1/{step_id}/{checkpoint.artifacts[0].path}",
            "projects/p/episodes/e1",
            "projects/p/episodes/e1/story.md",
        } <= covered
        assert stores.checkpoints.sealed(key, _seal_text(stores, key)) == seal
        # The project config only where the step declares it (end does; absent: its
        # appearance voids the seal).
        assert ("projects/p/project.yaml" in covered) == (step_id == "end")
    # The envelope's mtime is set a second into the past, so it is never racily clean.
    path = stores.checkpoints.path_for(_key("p/e1", "src"))
    assert path.stat().st_mtime_ns <= time.time_ns() - 900_000_000


def test_only_a_clean_completed_publish_leaves_a_seal(stores: Stores) -> None:
    seed(stores, "p/e1")
    ledger, key = stores.ledger, _key("p/e1", "src")
    assert _seal_text(stores, key)
    assert ledger.claim(key, "r1:0")
    assert _seal_text(stores, key) is None  # running: no verdict stands
    assert ledger.transition(key, "r1:0", "failed")
    assert _seal_text(stores, key) is None
    seed(stores, "p/e1", "src", run_id="again")  # a clean re-run (same content) seals again
    assert _seal_text(stores, key)
    assert ledger.invalidate([key], "forced upstream") == [key]
    assert _seal_text(stores, key) is None
    # A partial result (the verifier found a missing item) is not sealed.
    write_input(stores.checkpoints.home, "p/e2", "verify.json", {"src": "missing"})
    seed(stores, "p/e2", "src")
    row = stores.ledger.get(_key("p/e2", "src"))
    assert row is not None and row.status == "partial" and row.checkpoint_seal is None
    # An operator reset of a running row clears it too.
    key2 = _key("p/e1", "mid")
    assert ledger.claim(key2, "r2:0")
    set_row(stores, key2, checkpoint_seal=_seal_text(stores, _key("p/e1", "end")))
    assert ledger.reset_running(key2, stored_row(ledger, key2).started_at, "dead")
    assert _seal_text(stores, key2) is None


def test_an_adopted_orphan_checkpoint_is_sealed(stores: Stores) -> None:
    """Row 4: the adopting run verified the orphan clean, so its new row carries a seal."""
    seed(stores, "p/e1")
    key = _key("p/e1", "mid")
    delete_row(stores, key)
    _settle()
    seed(stores, "p/e1", "mid", run_id="adopter")
    row = stores.ledger.get(key)
    assert row is not None and (row.status, row.run_id) == ("completed", "adopter-mid:0")
    assert [t.action for t in stores.ledger.transitions()][-1] == "adopt"
    assert stores.checkpoints.sealed(key, row.checkpoint_seal) is not None


def test_a_published_envelope_is_sealed_only_as_the_version_that_was_verified(
    stores: Stores,
) -> None:
    seed(stores, "p/e1")
    key = _key("p/e1", "mid")
    verified = stores.checkpoints.load(key)
    assert verified is not None
    _settle()
    assert stores.checkpoints.seal(verified) is not None
    # Rewritten between the verification and the seal: the verdict is not carried over.
    _recopy(stores.checkpoints.path_for(key))
    assert stores.checkpoints.seal(verified) is None
    # A checkpoint object that was never read from this store is not sealed either.
    assert CheckpointStore(stores.checkpoints.home).seal(verified) is None


class _MidRevised(Mid):
    verify_revision = 2  # its verifier changed: old seals must not vouch for it


def test_a_new_verifier_revision_voids_old_seals(stores: Stores) -> None:
    seed(stores, "p/e1")
    _settle()
    now = datetime.now(UTC) + timedelta(seconds=1)
    revised = tuple(_MidRevised() if s.step_id == "mid" else s for s in SENSOR_STEPS)
    for steps, verified in ((SENSOR_STEPS, 0), (revised, 1)):
        judge = BatchJudge(steps, stores)
        VERIFY_CALLS.clear()
        judge.evaluate(["p/e1"], now, judge.load_rows(["p/e1"]))
        assert dict(VERIFY_CALLS) == ({"mid": 1} if verified else {})


# --------------------------------------------------------------------------- voiding
def _in_place(path: Path) -> None:
    data = path.read_bytes()
    with path.open("r+b") as handle:  # same inode, same size, new bytes
        handle.write(bytes([data[0] ^ 0xFF]) + data[1:])


def _recopy(path: Path) -> None:
    copy = path.with_name(path.name + ".copy")
    shutil.copy2(path, copy)  # same bytes, same mtime: only the inode differs
    os.replace(copy, path)


# A change is made for its effect on the files; what its call returns is ignored.
CHANGES: dict[str, Callable[[Stores], object]] = {
    "artifact deleted": lambda s: (_step_dir(s, "p/e1", "mid") / "frames" / "f0.png").unlink(),
    "artifact rewritten in place, same size": lambda s: _in_place(
        _step_dir(s, "p/e1", "mid") / "frames" / "f0.png"
    ),
    "artifact touched": lambda s: os.utime(_step_dir(s, "p/e1", "mid") / "frames" / "f0.png"),
    "checkpoint replaced by an identical copy": lambda s: _recopy(
        _step_dir(s, "p/e1", "mid") / "checkpoint.json"
    ),
    "checkpoint deleted": lambda s: (_step_dir(s, "p/e1", "mid") / "checkpoint.json").unlink(),
    "input file edited": lambda s: write_input(s.checkpoints.home, "p/e1", "story.md", "# twice\n"),
    "input file added": lambda s: write_input(
        s.checkpoints.home, "p/e1", "verify.json", {"mid": "drift"}
    ),
    "a declared read created (end: project config)": lambda s: _project_config(s),
}


def _project_config(stores: Stores) -> None:
    path = stores.checkpoints.home / "projects" / "p" / "project.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("style: noir\n")


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_change_to_a_sealed_file_voids_the_seal(stores: Stores, change: str) -> None:
    write_input(stores.checkpoints.home, "p/e1", "story.md", "# once\n")
    _settle()
    seed(stores, "p/e1")
    key = _key("p/e1", "end" if "(end:" in change else "mid")
    text = _seal_text(stores, key)
    assert stores.checkpoints.sealed(key, text) is not None
    _settle()
    CHANGES[change](stores)
    assert stores.checkpoints.sealed(key, text) is None


def test_an_undeclared_project_config_edit_keeps_the_seal(stores: Stores) -> None:
    """The judge compares scoped config itself; unrelated keys must not void every seal."""
    seed(stores, "p/e1")
    _settle()
    _project_config(stores)
    key = _key("p/e1", "mid")
    assert stores.checkpoints.sealed(key, _seal_text(stores, key)) is not None


def test_racily_clean_files_are_hashed_again(tmp_path: Path) -> None:
    """A file written in the sealing tick keeps its mtime through a same-size rewrite."""
    home = tmp_path
    step_dir = home / "checkpoints" / "p" / "e1" / "s"
    step_dir.mkdir(parents=True)
    envelope, artifact = step_dir / "checkpoint.json", step_dir / "a.png"
    envelope.write_text("{}")
    past = time.time_ns() - 10_000_000_000
    os.utime(envelope, ns=(past, past))
    artifact.write_bytes(b"pixels")
    sha = hashlib.sha256(b"pixels").hexdigest()
    mtime = artifact.stat().st_mtime_ns
    seal = _seal(home, envelope, {"a.png": sha}, sealed_ns=mtime + 1_000_000)  # racy
    assert seal is not None and SealedFile(*seal.files[0]).sha256 == sha
    assert seal.holds(str(home), str(envelope))
    _in_place(artifact)
    os.utime(artifact, ns=(mtime, mtime))  # the same identity, as within one tick
    assert identity_of(artifact) == SealedFile(*seal.files[0]).identity
    assert not seal.holds(str(home), str(envelope))
    # The same file sealed well after its write carries no hash: identity is enough.
    calm = _seal(home, envelope, {"a.png": sha}, sealed_ns=mtime + 5_000_000_000)
    assert calm is not None and SealedFile(*calm.files[0]).sha256 is None
    # A racy envelope or a racy directory cannot be sealed at all; absent reads are kept.
    assert _seal(home, envelope, {}, sealed_ns=past + 1) is None
    assert _seal(home, envelope, {}, reads=[step_dir], sealed_ns=mtime) is None
    gone = _seal(home, envelope, {}, reads=[home / "nothing.txt"], sealed_ns=time.time_ns())
    assert gone is not None and SealedFile(*gone.reads[0]).identity == ABSENT
    (home / "nothing.txt").write_text("now here")
    assert not gone.holds(str(home), str(envelope))
    # A missing artifact or a read outside the home: no seal.
    assert _seal(home, envelope, {"b.png": sha}, sealed_ns=time.time_ns()) is None
    outside = [Path("/etc/hostname")]
    assert _seal(home, envelope, {}, reads=outside, sealed_ns=time.time_ns()) is None


def _seal(
    home: Path, envelope: Path, artifacts: dict[str, str], *, sealed_ns: int, reads: Any = ()
) -> Seal | None:
    from pipeline_defs.resume.decision_types import CheckpointSummary

    summary = CheckpointSummary(True, 1, StepStatus.COMPLETED, "h", {})
    sealed = make_seal(
        home=home,
        checkpoint_file=envelope,
        summary=summary,
        version="v",
        artifacts=artifacts,
        reads=reads,
        sealed_ns=sealed_ns,
    )
    if sealed is not None:
        assert Seal.decode(sealed.encode()) == sealed  # the text form round-trips
    return sealed


_V2_VERDICT = '{"art":[],"ch":"h","fp":{},"st":"completed","sv":1,"vr":1}'


def _v2(*parts: str) -> str:
    return "\x1f".join(parts)


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[]",
        '{"v": 99}',
        '{"v": 1}',
        '{"v": 1, "cp": "x"}',
        # Version 2 (compact) texts that are cut, padded or of the wrong types.
        "2",
        _v2("2", _V2_VERDICT, "1", "v", "1,2,3", ""),  # a part missing
        _v2("2", _V2_VERDICT, "1", "v", "1,2,3", "", "", ""),  # a part too many
        _v2("2", "not json", "1", "v", "1,2,3", "", ""),
        _v2("2", '{"fp":[]}', "1", "v", "1,2,3", "", ""),
        _v2("2", _V2_VERDICT, "x", "v", "1,2,3", "", ""),
        _v2("2", _V2_VERDICT, "1", "v", "1,2", "", ""),
        _v2("2", _V2_VERDICT, "1", "v", "1,2,3", "a\x1d1\x1d2", ""),  # an entry cut short
        _v2("2", _V2_VERDICT, "1", "v", "1,2,3", "", "a\x1dx\x1d2\x1d3\x1d"),
    ],
)
def test_unreadable_seal_text_means_judge_the_long_way(stores: Stores, text: Any) -> None:
    assert Seal.decode(text) is None
    assert stores.checkpoints.sealed(_key("p/e1", "src"), text) is None


def _a_seal(version: str = "2026-12-02T15:00:00+00:00|run-1:0|0", path: str = "a/b.png") -> Seal:
    from pipeline_defs.resume.decision_types import CheckpointSummary

    return Seal(
        checkpoint=(1_764_690_000_123_456_789, 2345, 12345678),
        summary=CheckpointSummary(True, 3, StepStatus.COMPLETED, "h" * 64, {"scenes.n": "f" * 16}),
        version=version,
        artifacts=("refs/C01.png",),
        files=((path, 1_764_690_000_123_456_789, 2056, 12345679, None),),
        reads=(
            ("projects/p/episodes/e1/story.md", 1, 2, 3, "ab" * 32),
            ("projects/p/episodes/e1/absent.md", -1, -1, -1, None),
        ),
        sealed_ns=1_764_690_000_999_999_999,
        revision=2,
    )


def test_a_seal_round_trips_in_the_compact_form_and_rows_sealed_before_still_decode() -> None:
    seal = _a_seal()
    compact = seal.encode()
    assert compact.startswith("2\x1f")
    assert Seal.decode(compact) == seal
    # Rows sealed before the compact form (one JSON object) stay trusted.
    before = seal.encode_v1()
    assert before.startswith("{")
    assert Seal.decode(before) == seal
    assert len(compact) < len(before)


@pytest.mark.parametrize(
    "field", ["version", "path"], ids=["separator in the version", "separator in a path"]
)
def test_a_seal_whose_text_holds_a_separator_is_written_in_the_json_form(field: str) -> None:
    seal = _a_seal(**{field: "a\x1fb\x1ec\x1dd"})
    text = seal.encode()
    assert text.startswith("{")  # never split wrongly: the JSON form escapes them
    assert Seal.decode(text) == seal


# --------------------------------------------------------------------------- agreement
# As CHANGES: a mutation is made for its effect, what its call returns is ignored.
MUTATIONS: dict[str, Callable[[Stores, str], object]] = {
    "nothing": lambda s, pk: None,
    "png deleted": lambda s, pk: (_step_dir(s, pk, "mid") / "frames" / "f0.png").unlink(),
    "png edited in place": lambda s, pk: _in_place(_step_dir(s, pk, "mid") / "frames" / "f0.png"),
    "src artifact edited": lambda s, pk: (_step_dir(s, pk, "src") / "out.bin").write_bytes(b"x"),
    "checkpoint deleted": lambda s, pk: (_step_dir(s, pk, "end") / "checkpoint.json").unlink(),
    "checkpoint corrupted": lambda s, pk: (_step_dir(s, pk, "side") / "checkpoint.json").write_text(
        "{"
    ),
    "verifier drift": lambda s, pk: write_input(
        s.checkpoints.home, pk, "verify.json", {"mid": "drift"}
    ),
    "verifier crash": lambda s, pk: write_input(
        s.checkpoints.home, pk, "verify.json", {"end": "crash"}
    ),
    "side not applicable": lambda s, pk: write_input(s.checkpoints.home, pk, "no_side", ""),
    "row failed": lambda s, pk: (
        s.ledger.claim(_key(pk, "src"), "f:0")
        and s.ledger.transition(_key(pk, "src"), "f:0", "failed")
    ),
    "row deleted": lambda s, pk: delete_row(s, _key(pk, "mid")),
    "seal of another step": lambda s, pk: set_row(
        s, _key(pk, "mid"), checkpoint_seal=_seal_text(s, _key(pk, "src"))
    ),
    "garbage seal": lambda s, pk: set_row(s, _key(pk, "end"), checkpoint_seal='{"v":1}'),
}


def _view(evaluations: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (
            e.partition_key,
            e.step_id,
            e.decision.action,
            e.decision.code,
            e.decision.origin,
            e.decision.reason,
            e.verdict,
            e.run_key,
            e.block_signature,
        )
        for e in evaluations
    ]


def test_sealed_and_unsealed_judgements_agree(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random mixes of changes: the sensor's verdicts are the same with and without seals."""
    rng = random.Random(20261130)
    names = sorted(MUTATIONS)
    keys = [f"p/e{n}" for n in range(24)]
    for pk in keys:
        write_input(stores.checkpoints.home, pk, "story.md", f"# {pk}\n")
    _settle()
    for pk in keys:
        seed(stores, pk)
    _settle()
    applied = {}
    for n, pk in enumerate(keys):
        chosen = [names[n]] if n < len(names) else rng.sample(names, 3)
        applied[pk] = chosen
        for name in chosen:
            MUTATIONS[name](stores, pk)
    now = datetime.now(UTC) + timedelta(seconds=1)
    rows = BatchJudge(SENSOR_STEPS, stores).load_rows(keys)
    VERIFY_CALLS.clear()
    sealed = BatchJudge(SENSOR_STEPS, stores).evaluate(keys, now, rows)
    sealed_calls = sum(VERIFY_CALLS.values())
    VERIFY_CALLS.clear()
    full = BatchJudge(SENSOR_STEPS, stores, trust_seals=False).evaluate(keys, now, rows)
    full_calls = sum(VERIFY_CALLS.values())
    for a, b in zip(_view(sealed), _view(full), strict=True):
        assert a == b, (applied[a[0]], a, b)
    # And the seals spared work: an untouched partition is not verified again at all.
    assert sealed_calls < full_calls, (sealed_calls, full_calls)
    (untouched,) = [pk for pk, names in applied.items() if names == ["nothing"]]
    VERIFY_CALLS.clear()
    loads: list[StepKey] = []
    original = CheckpointStore.load

    def counted(self: CheckpointStore, key: StepKey) -> Checkpoint | None:
        loads.append(key)
        return original(self, key)

    monkeypatch.setattr(CheckpointStore, "load", counted)
    BatchJudge(SENSOR_STEPS, stores).evaluate([untouched], now, rows)
    assert sum(VERIFY_CALLS.values()) == 0 and loads == []  # not even read
