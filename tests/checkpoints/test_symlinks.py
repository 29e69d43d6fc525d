"""No escape from the home (docs/DESIGN.md#no-escape): a symlink where a file or directory of
ours should be is a typed block (``checkpoint.symlink``, contract drift, naming the link),
never followed, never deleted, and nothing outside ``PIPELINE_HOME`` changes.

Every link points to a directory OUTSIDE the home holding sentinel files (often the very
files that were moved out, so that a judge following the link would find them valid).
After each operation the outside tree must be identical (same entries, bytes and mtimes,
nothing added) and the link still in place.

- storyboard: the real pipeline built on SQLite and PostgreSQL, then the read-only judge,
  the resume sensor (seals trusted: the hot path), Dagster resume and force launches of the
  step, and a force of its upstream step (the observed bug: forcing ``ref_image_gen``
  pruned the archive of ``composite_image_gen`` through a linked ``archive/``);
- store: the same on plain files, for every component from the home down and every
  writing operation (stage/save, archive pruning, force markers, pending edits, artifacts).
"""

import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from checkpoint_support import KEY, checkpoint, loaded
from judge_steps import make_data
from storyboard_support import (
    PARTITION,
    PROJECT,
    Env,
    scratch_dir,
    step_failure_messages,
    write_episode,
)

from pipeline_defs.judging.evaluation import BatchJudge
from pipeline_defs.judging.step_evaluation import Verdict
from pipeline_defs.judging.stores import Stores
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.errors import PipelineError, status_of
from pipeline_defs.resume.layout import ARCHIVE_DIR, FORCE_MARKER
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.storyboard import STORYBOARD_STEPS
from resources.checkpoints.store import CheckpointStore

CODE = "checkpoint.symlink"
FORCE = {"resume/mode": "force"}
Tree = dict[str, tuple[object, ...]]


# ----------------------------------------------------------------------------- helpers
def tree(root: Path) -> Tree:
    """Every entry below ``root`` (and root itself), never following a link: kind, bytes,
    mtime. A directory's mtime moves when anything is created in it, even if removed."""
    out: Tree = {".": ("dir", os.lstat(root).st_mtime_ns)}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            info = os.lstat(path)
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                out[rel] = ("dir", info.st_mtime_ns)
            else:
                out[rel] = ("file", path.read_bytes(), info.st_mtime_ns)
    return out


def plant(link: Path, outside: Path) -> Path:
    """Replace ``link`` by a symlink into ``outside``: an existing file or directory is moved
    there (same inode: its old identity and bytes stay valid), else sentinels are made."""
    outside.mkdir(parents=True, exist_ok=True)
    target = outside / link.name.lstrip(".")
    if os.path.lexists(link):
        os.rename(link, target)  # same filesystem: a rename keeps inodes and mtimes
    else:
        target.mkdir()
        # Named like archives, and older than any real one: pruning would take them first.
        for n in range(8):
            (target / f"2000-01-01T00000{n}-000000Z-replaced.json").write_text(f'{{"n": {n}}}')
        (target / "notes.txt").write_text("not yours")
    os.symlink(target, link)
    return target


def assert_link_kept(link: Path, target: Path) -> None:
    assert link.is_symlink(), f"{link} was removed or replaced"
    assert os.readlink(link) == str(target)


def assert_names_link(text: str, link: Path) -> None:
    assert CODE in text, text
    assert str(link) in text, text


# ----------------------------------------------------------------------------- storyboard
# where the link goes (relative to the episode's checkpoint directory; "" = that directory
# itself), the step whose judgement and runs must block, the upstream step whose explicit
# force must stop at the link instead of deleting or writing through it.
CASES = {
    "episode_dir": ("", "composite_image_gen", "ref_image_gen"),
    "step_dir": ("composite_image_gen", "composite_image_gen", "ref_image_gen"),
    "archive_dir": ("composite_image_gen/archive", "composite_image_gen", "ref_image_gen"),
    "artifact_dir": ("composite_image_gen/composites", "composite_image_gen", "ref_image_gen"),
    "png": ("composite_image_gen/composites/C01_O01.png", "composite_image_gen", "ref_image_gen"),
    "receipt": (
        "composite_image_gen/composites/C01_O01.png.receipt.json",
        "composite_image_gen",
        "ref_image_gen",
    ),
    "checkpoint_json": (
        "composite_image_gen/checkpoint.json",
        "composite_image_gen",
        "ref_image_gen",
    ),
    "force_marker": (f"composite_image_gen/{FORCE_MARKER}", "composite_image_gen", "ref_image_gen"),
    "ref_step_dir": ("ref_image_gen", "ref_image_gen", "t2i_review"),
    "pending_dir": ("t2i_review/pending", "t2i_review", "scene_detail"),
}


# Entries of a step directory that no seal covers (see step 2 below): the archive, the
# force marker, a receipt beside a PNG (the envelope lists the PNG only), a mutator's
# write-ahead directory (spent once its row holds the result).
NOT_SEALED_ENTRIES = {"archive_dir", "force_marker", "receipt", "pending_dir"}


@pytest.fixture
def built_in_place(db_url: str) -> Iterator[Env]:
    """The whole storyboard built in place (not copied), so every seal still holds."""
    env = Env(scratch_dir("links"), db_url)
    write_episode(env.home)
    env.first = env.materialize()
    assert env.first.result.success
    try:
        yield env
    finally:
        env.destroy()


def sensor_block(env: Env, step_id: str, *, trust_seals: bool = True) -> str:
    """The resume sensor's verdict on ``step_id`` (seals trusted by default): a block."""
    judge = BatchJudge(STORYBOARD_STEPS, Stores.of(env.pipeline), trust_seals=trust_seals)
    rows = judge.load_rows([PARTITION])
    found = {e.step_id: e for e in judge.evaluate([PARTITION], datetime.now(UTC), rows)}
    evaluation = found[step_id]
    assert evaluation.verdict is Verdict.BLOCKED, (evaluation.verdict, evaluation.detail)
    assert evaluation.decision.origin is Origin.CONTRACT_DRIFT
    return evaluation.decision.reason


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_planted_link_blocks_every_path_and_nothing_outside_changes(
    built_in_place: Env, case: str
) -> None:
    env = built_in_place
    where, step_id, upstream = CASES[case]
    episode_dir = env.checkpoints.root / PROJECT / "ep01"
    link = episode_dir / where if where else episode_dir
    if case == "force_marker":  # a marker is a file: plant one outside and link to it
        outside_file = env.root / "outside" / "force_cleared"
        outside_file.parent.mkdir()
        outside_file.write_text("marker of someone else")
        os.symlink(outside_file, link)
        target = outside_file
    else:
        target = plant(link, env.root / "outside")
    outside = env.root / "outside"
    assert not outside.is_relative_to(env.home)
    before = tree(outside)
    row = env.row(step_id)
    assert row is not None and row.status == "completed"

    def unchanged(after: str) -> None:
        assert tree(outside) == before, f"outside changed by {after}"
        assert_link_kept(link, target)

    # 1. the read-only judge (what a run judges from): a visible block, never a SKIP
    decision = env.judge(step_id)
    assert decision.action is ResumeAction.BLOCK, decision
    assert decision.origin is Origin.CONTRACT_DRIFT
    assert_names_link(decision.reason, link)
    unchanged("judge")

    # 2. the resume sensor. Seals trusted (the hot path; built in place, every row is
    # sealed, a mutator's re-sealed after its edits): a seal checks, without following
    # links, what its verdict reads: every directory down to the step and artifact
    # directories, the envelope and the artifacts (lstat identities, which no link has). A
    # link elsewhere in the step directory (archive/, pending/, the force marker, a receipt)
    # is read by no sealed verdict and is not looked for there: the seal holds (SKIP,
    # nothing read through it) and every writer refuses it (steps 3-5). The long way (seals
    # not trusted) blocks on every link.
    assert row.checkpoint_seal
    holds = env.checkpoints.sealed(env.key(step_id), row.checkpoint_seal) is not None
    assert holds is (case in NOT_SEALED_ENTRIES), case
    if case not in NOT_SEALED_ENTRIES:
        assert_names_link(sensor_block(env, step_id), link)
    assert_names_link(sensor_block(env, step_id, trust_seals=False), link)
    unchanged("sensor")

    # 3. a Dagster resume launch of the step: fails with the block, touches nothing
    outcome = env.materialize([step_id], raise_on_error=False)
    assert not outcome.result.success
    assert outcome.total_calls == 0
    assert_names_link(step_failure_messages(outcome.result)[step_id], link)
    unchanged("resume launch")

    # 4. an explicit force of the step itself
    outcome = env.materialize([step_id], tags=FORCE, raise_on_error=False)
    assert not outcome.result.success
    assert_names_link(step_failure_messages(outcome.result)[step_id], link)
    unchanged("force of the step")

    # 5. an explicit force upstream: invalidating the step must not archive, prune or
    # delete through the link (the observed bug)
    outcome = env.materialize([upstream], tags=FORCE, raise_on_error=False)
    assert not outcome.result.success
    assert_names_link(step_failure_messages(outcome.result)[upstream], link)
    unchanged("force upstream")


def test_the_observed_archive_pruning_bug(built_in_place: Env) -> None:
    """As first reported: composite_image_gen/archive linked outside, then
    ``force --step ref_image_gen``: four outside files were pruned and the force archive
    was written outside. Now the force fails, typed, before writing anything there."""
    env = built_in_place
    link = env.step_dir("composite_image_gen") / ARCHIVE_DIR
    target = plant(link, env.root / "outside")
    before = tree(target)
    outcome = env.materialize(["ref_image_gen"], tags=FORCE, raise_on_error=False)
    assert not outcome.result.success
    message = step_failure_messages(outcome.result)["ref_image_gen"]
    assert_names_link(message, link)
    assert tree(target) == before
    assert_link_kept(link, target)
    # the composite checkpoint was not taken out of service through the link either
    assert env.checkpoint_path("composite_image_gen").is_file()


# ----------------------------------------------------------------------------- store


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "home", keep_archives=2)


def temp_files(store: CheckpointStore) -> list[str]:
    return [p.name for p in store.root.rglob(".checkpoint.*.tmp")]


def check(caught: pytest.ExceptionInfo[PipelineError], link: Path) -> None:
    error = caught.value
    assert error.code == CODE
    assert error.origin == Origin.CONTRACT_DRIFT.value
    assert error.status == status_of(CODE) == 409
    assert str(link) in error.message
    assert error.details["path"] == str(link)


LEVELS = ["checkpoints", "project", "episode", "step", "checkpoint.json", "archive"]


def level_path(store: CheckpointStore, level: str) -> Path:
    step = store.step_dir(KEY)
    return {
        "checkpoints": store.root,
        "project": step.parent.parent,
        "episode": step.parent,
        "step": step,
        "checkpoint.json": store.path_for(KEY),
        "archive": step / ARCHIVE_DIR,
    }[level]


@pytest.mark.parametrize("level", LEVELS)
def test_every_component_from_the_home_down_is_refused(
    store: CheckpointStore, tmp_path: Path, level: str
) -> None:
    assert store.save(checkpoint("a"))
    assert store.save(checkpoint("b"))  # one archive exists
    link = level_path(store, level)
    target = plant(link, tmp_path / "outside")
    before = tree(tmp_path / "outside")

    for operation in (
        lambda: store.load(KEY),
        lambda: store.save(checkpoint("c")),
        lambda: store.archive(KEY, "replaced"),
        lambda: store.force_clear(KEY),
        lambda: store.write_artifact(KEY, "out/a.png", b"png"),
        lambda: store.has_force_marker(KEY),
    ):
        with pytest.raises(PipelineError) as caught:
            operation()
        check(caught, link)
        assert tree(tmp_path / "outside") == before
        assert_link_kept(link, target)
    assert temp_files(store) == []


def test_a_linked_force_marker_is_neither_written_nor_removed(
    store: CheckpointStore, tmp_path: Path
) -> None:
    assert store.save(checkpoint("a"))
    marker = store.step_dir(KEY) / FORCE_MARKER
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "marker").write_text("theirs")
    os.symlink(outside / "marker", marker)
    before = tree(outside)
    published = store.path_for(KEY).read_bytes()
    for operation in (
        lambda: store.force_clear(KEY),
        lambda: store.save(checkpoint("b")),
        lambda: store.load(KEY),
    ):
        with pytest.raises(PipelineError) as caught:
            operation()
        check(caught, marker)
    assert tree(outside) == before and os.readlink(marker) == str(outside / "marker")
    assert store.path_for(KEY).read_bytes() == published  # not taken out of service
    assert temp_files(store) == []


def test_a_linked_archive_entry_is_never_pruned(store: CheckpointStore, tmp_path: Path) -> None:
    for version in "abc":
        assert store.save(checkpoint(version))
    archive = store.step_dir(KEY) / ARCHIVE_DIR
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "old.json").write_text("{}")
    link = archive / "0000-oldest-replaced.json"  # sorts first: pruning would take it
    os.symlink(outside / "old.json", link)
    before = tree(outside)
    with pytest.raises(PipelineError) as caught:
        store.save(checkpoint("d"))
    check(caught, link)
    assert tree(outside) == before and link.is_symlink()
    assert loaded(store, KEY).data == make_data(["c"])
    assert temp_files(store) == []


def test_linked_pending_edits_are_refused_not_treated_as_absent(
    store: CheckpointStore, tmp_path: Path
) -> None:
    assert store.save(checkpoint("a"))
    victim = checkpoint("v")
    pending_dir = store.step_dir(KEY) / "pending"
    target = plant(pending_dir, tmp_path / "outside")
    before = tree(tmp_path / "outside")
    with pytest.raises(PipelineError) as caught:
        store.write_pending(KEY, victim)
    check(caught, pending_dir)
    assert tree(tmp_path / "outside") == before
    assert_link_kept(pending_dir, target)

    # a pending file itself linked (say to a forged edit): refused when read or dropped
    os.unlink(pending_dir)
    pending_dir.mkdir()
    forged = tmp_path / "forged.json"
    forged.write_text(victim.to_json())
    link = store.pending_path(KEY, victim.step_id)
    os.symlink(forged, link)
    for operation in (
        lambda: store.load_pending(KEY, victim.step_id),
        lambda: store.drop_pending(KEY, victim.step_id),
        lambda: store.write_pending(KEY, victim),
    ):
        with pytest.raises(PipelineError) as caught:
            operation()
        check(caught, link)
        assert os.readlink(link) == str(forged)
    assert forged.read_text() == victim.to_json()


@pytest.mark.parametrize("linked", ["out", "out/a.png"])
def test_artifacts_are_never_written_or_read_through_a_link(
    store: CheckpointStore, tmp_path: Path, linked: str
) -> None:
    kept = store.write_artifact(KEY, "out/a.png", b"png")
    assert store.save(checkpoint("a").with_changes(artifacts=(kept,)))
    link = store.step_dir(KEY) / linked
    target = plant(link, tmp_path / "outside")
    before = tree(tmp_path / "outside")
    for operation in (
        lambda: store.write_artifact(KEY, "out/a.png", b"new"),
        lambda: store.write_artifact(KEY, "out/b.png", b"new"),
        lambda: store.artifact_path(KEY, "out/a.png"),
        lambda: store.artifact_problems(store.load(KEY)),  # type: ignore[arg-type]
    ):
        with pytest.raises(PipelineError) as caught:
            operation()
        check(caught, link)
        assert tree(tmp_path / "outside") == before
        assert_link_kept(link, target)
    # lexical escapes stay what they were: invalid input, not a link
    with pytest.raises(PipelineError) as escaped:
        store.artifact_path(KEY, "../beta/out.png")
    assert escaped.value.code == "input.invalid"


def test_a_link_planted_after_the_step_directory_was_checked_is_still_seen(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """The per-directory memo that keeps the judge cheap is keyed on the directory's own
    identity: planting a link changes it, so the next load sees the link."""
    assert store.save(checkpoint("a"))
    os.utime(store.step_dir(KEY), ns=(1, 1))  # an old, settled directory: memoizable
    assert store.load(KEY) is not None
    assert store.load(KEY) is not None  # memo hit
    link = store.step_dir(KEY) / ARCHIVE_DIR
    plant(link, tmp_path / "outside")
    with pytest.raises(PipelineError) as caught:
        store.load(KEY)
    check(caught, link)


def test_a_link_planted_between_stage_and_commit_is_not_replaced(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """The fenced rename would replace (delete) a link at the target: commit refuses it,
    inside the fence, so the ledger transaction publishing it rolls back too."""
    assert store.save(checkpoint("a"))
    staged = store.stage(checkpoint("b"))
    target = plant(store.path_for(KEY), tmp_path / "outside")
    before = tree(tmp_path / "outside")
    with pytest.raises(PipelineError) as caught:
        staged.commit()
    check(caught, store.path_for(KEY))
    staged.discard()
    assert tree(tmp_path / "outside") == before
    assert_link_kept(store.path_for(KEY), target)
    assert temp_files(store) == []


def test_listing_checkpoints_never_walks_through_a_link(
    store: CheckpointStore, tmp_path: Path
) -> None:
    assert store.save(checkpoint("a"))
    other = StepKey(KEY.project_id, KEY.episode_id, "beta")
    store.step_dir(other).mkdir()
    plant(store.step_dir(other), tmp_path / "outside")  # a linked step: listed, load refuses
    for name in ("proj2", "proj3"):  # a linked project: never listed through the link
        outside = tmp_path / f"outside-{name}" / "ep1" / "alpha"
        outside.mkdir(parents=True)
        (outside / "checkpoint.json").write_text("{}")
        os.symlink(tmp_path / f"outside-{name}", store.root / name)
    assert list(store.iter_keys()) == [KEY, other]
    with pytest.raises(PipelineError) as caught:
        store.load(other)
    check(caught, store.step_dir(other))


# ----------------------------------------------------------------------------- no-escape gaps
def test_a_force_refuses_a_downstream_link_before_changing_the_ledger(built_in_place: Env) -> None:
    """Gap 1: forcing ref_image_gen invalidated composite_image_gen's row (stale) before the
    force-clear met the link in its step directory. The refusal comes first now (the
    judge blocks the force): no row, no file of the episode changes."""
    env = built_in_place
    link = env.step_dir("composite_image_gen") / ARCHIVE_DIR
    target = plant(link, env.root / "outside")
    rows, seq, files = env.rows(), env.ledger.cursor()[0], env.snapshot()
    outcome = env.materialize(["ref_image_gen"], tags=FORCE, raise_on_error=False)
    assert not outcome.result.success
    assert_names_link(step_failure_messages(outcome.result)["ref_image_gen"], link)
    assert env.rows() == rows
    # the judge's refusal is audited as a block; no row moved (no claim, no invalidation)
    audit = [
        (t.step_id, t.action, t.from_status, t.to_status)
        for t in env.ledger.transitions(since_seq=seq)
    ]
    assert audit == [("ref_image_gen", "block", "completed", "completed")]
    assert env.snapshot() == files
    assert_link_kept(link, target)


def fail_row(env: Env, step_id: str) -> None:
    """A failed ledger row, as a run that died with an error leaves it."""
    key = env.key(step_id)
    assert env.ledger.claim(key, "failed-run:0")
    assert env.ledger.transition(key, "failed-run:0", "failed", error="boom")


def test_a_linked_checkpoint_of_a_failed_row_blocks(built_in_place: Env) -> None:
    """Gap 2: a failed row was judged RERUN_SELF whatever its checkpoint was; a linked
    checkpoint must block like on a completed row, in the judge and in the sensor."""
    env = built_in_place
    step_id = "composite_image_gen"
    link = env.checkpoint_path(step_id)
    target = plant(link, env.root / "outside")
    fail_row(env, step_id)
    decision = env.judge(step_id)
    assert decision.action is ResumeAction.BLOCK, decision
    assert decision.origin is Origin.CONTRACT_DRIFT
    assert_names_link(decision.reason, link)
    assert_names_link(sensor_block(env, step_id), link)
    before = tree(env.root / "outside")
    outcome = env.materialize([step_id], raise_on_error=False)
    assert not outcome.result.success and outcome.total_calls == 0
    assert_names_link(step_failure_messages(outcome.result)[step_id], link)
    assert tree(env.root / "outside") == before
    assert_link_kept(link, target)


@pytest.mark.parametrize("where", ["step_dir", "episode_dir"])
def test_the_sensor_tick_notices_a_link_instead_of_following_it(
    built_in_place: Env, where: str
) -> None:
    """Gap 3: the tick's change detection stat'ed directories through links, so a step (or
    episode) directory moved outside and linked back looked unchanged: no re-judge, no
    block. With lstat the link has its own identity and the tick re-judges and blocks."""
    from pipeline_defs.judging.tick import ResumeTicker
    from pipeline_defs.judging.tick_result import TickConfig

    env = built_in_place
    ticker = ResumeTicker(STORYBOARD_STEPS, Stores.of(env.pipeline), TickConfig(workers=1))
    now = datetime.now(UTC)
    first = ticker.tick([PARTITION], now, None)
    assert ticker.tick([PARTITION], now, first.cursor).stats.mode == "unchanged"
    step_dir = env.step_dir("composite_image_gen")
    link = step_dir if where == "step_dir" else step_dir.parent
    target = plant(link, env.root / "outside")
    before = tree(env.root / "outside")
    result = ticker.tick([PARTITION], now, first.cursor)
    assert result.stats.mode != "unchanged"
    blocked = {e.step_id: e for e in result.evaluations if e.verdict is Verdict.BLOCKED}
    assert "composite_image_gen" in blocked, result.stats.line()
    assert_names_link(blocked["composite_image_gen"].decision.reason, link)
    assert tree(env.root / "outside") == before
    assert_link_kept(link, target)


INPUT_CASES = {
    # what is linked (relative to projects/<p>), the step that must block on it
    "story": ("episodes/ep01/story.md", "story_source"),
    "episode_inputs": ("episodes/ep01", "story_source"),
    "episodes": ("episodes", "story_source"),
    "project_yaml": ("project.yaml", "story_source"),
    "project_dir": ("", "story_source"),
}


@pytest.mark.parametrize("case", sorted(INPUT_CASES))
def test_a_linked_input_is_refused_naming_it(built_in_place: Env, case: str) -> None:
    """Gap 4: inputs under projects/ were read through links. Now a link there is the same
    typed refusal as in the checkpoint tree (``checkpoint.symlink``: one code for "a link
    where a file or directory of the pipeline should be"), in the judge, the sensor (seals
    trusted) and a run; the input is never read through it."""
    env = built_in_place
    where, step_id = INPUT_CASES[case]
    project = env.home / "projects" / PROJECT
    link = project / where if where else project
    if case == "project_yaml" and not link.exists():
        link.write_text("title: mine\n")
    target = plant(link, env.root / "outside")
    before = tree(env.root / "outside")
    try:
        decision = env.judge(step_id)
    except PipelineError as exc:  # the project config itself is unreadable: the typed error
        assert exc.code == CODE and exc.details["path"] == str(link), exc
    else:
        assert decision.action is ResumeAction.BLOCK, decision
        assert_names_link(decision.reason, link)
    assert_names_link(sensor_block(env, step_id), link)
    outcome = env.materialize([step_id], tags=FORCE, raise_on_error=False)
    assert not outcome.result.success and outcome.total_calls == 0
    assert_names_link(step_failure_messages(outcome.result)[step_id], link)
    assert tree(env.root / "outside") == before
    assert_link_kept(link, target)


def test_a_mutator_force_with_a_linked_pending_edit_makes_no_provider_call(
    built_in_place: Env,
) -> None:
    """Gap 5: forcing t2i_review with pending/scene_detail.json linked outside made its
    review call first and met the link only when writing the edit ahead."""
    env = built_in_place
    pending = env.step_dir("t2i_review") / "pending"
    pending.mkdir(exist_ok=True)
    forged = env.root / "outside" / "scene_detail.json"
    forged.parent.mkdir()
    forged.write_text("{}")
    link = pending / "scene_detail.json"
    os.symlink(forged, link)
    rows, before = env.rows(), tree(env.root / "outside")
    outcome = env.materialize(["t2i_review"], tags=FORCE, raise_on_error=False)
    assert not outcome.result.success
    assert outcome.total_calls == 0
    assert_names_link(step_failure_messages(outcome.result)["t2i_review"], link)
    assert env.rows() == rows
    assert tree(env.root / "outside") == before
    assert os.readlink(link) == str(forged)
