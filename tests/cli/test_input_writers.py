"""Writers of inputs (``add-episode``, the demo) never write outside ``PIPELINE_HOME`` and
refuse at the door what ``story_source`` would refuse later.

Driven as it happens: real symbolic links planted in the home pointing at a directory
outside it, real directories, a real FIFO and ``/dev/zero`` given as the story. Each case
checks the outside tree is byte-identical afterwards and that no partition was registered.
"""

import os
import threading
from pathlib import Path

import dagster as dg
import pytest
from cli_helpers import CliEnv, make_env, tree_snapshot

from pipeline_defs.operations.workspace import PARTITIONS_NAME
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.files import write_file_under


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the home, with one file of its own."""
    found = tmp_path / "outside"
    found.mkdir()
    (found / "keep.txt").write_text("not the pipeline's\n")
    return found


def partitions(cli: CliEnv) -> list[str]:
    instance = dg.DagsterInstance.from_config(str(cli.dagster_home))
    return list(instance.get_dynamic_partitions(PARTITIONS_NAME))


def add_episode(cli: CliEnv, project: str, episode: str, story: Path) -> tuple[int, str]:
    result = cli.invoke(
        "add-episode", "--project", project, "--episode", episode, "--story", str(story)
    )
    return result.exit_code, result.output + (result.stderr or "")


def test_a_linked_project_directory_is_refused_before_anything_is_created(
    cli: CliEnv, outside: Path
) -> None:
    (cli.home / "projects").mkdir(parents=True)
    (cli.home / "projects" / "demo").symlink_to(outside, target_is_directory=True)
    before = tree_snapshot(outside)
    code, output = add_episode(cli, "demo", "ep09", cli.story("fox"))
    assert code == 1
    assert "[checkpoint.symlink]" in output and "nothing is read or written" in output
    assert tree_snapshot(outside) == before  # no episodes/ep09/story.md out there
    assert not (outside / "episodes").exists() and not (outside / "project.yaml").exists()
    assert (cli.home / "projects" / "demo").is_symlink()  # left in place
    assert partitions(cli) == []


def test_a_linked_episode_directory_is_refused_and_not_registered(
    cli: CliEnv, outside: Path
) -> None:
    code, _ = add_episode(cli, "demo", "ep01", cli.story("fox"))
    assert code == 0
    (cli.home / "projects" / "demo" / "episodes" / "ep10").symlink_to(
        outside, target_is_directory=True
    )
    before = tree_snapshot(outside)
    code, output = add_episode(cli, "demo", "ep10", cli.story("ship"))
    assert code == 1, output
    assert "[checkpoint.symlink]" in output and "ep10" in output
    assert "story created" not in output
    assert tree_snapshot(outside) == before
    assert partitions(cli) == ["demo/ep01"]


def test_a_linked_story_file_is_refused_and_its_target_kept(cli: CliEnv, outside: Path) -> None:
    assert add_episode(cli, "demo", "ep01", cli.story("fox"))[0] == 0
    story = cli.home / "projects" / "demo" / "episodes" / "ep01" / "story.md"
    story.unlink()
    story.symlink_to(outside / "keep.txt")
    before = tree_snapshot(outside)
    result = cli.invoke(
        "add-episode", "--project", "demo", "--episode", "ep01",
        "--story", str(cli.story("ship")), "--replace",
    )  # fmt: skip
    assert result.exit_code == 1 and "[checkpoint.symlink]" in result.stderr
    assert tree_snapshot(outside) == before
    assert story.is_symlink()


def test_a_linked_projects_root_stops_the_demo(cli: CliEnv, outside: Path) -> None:
    cli.home.mkdir(parents=True, exist_ok=True)
    (cli.home / "projects").symlink_to(outside, target_is_directory=True)
    before = tree_snapshot(outside)
    result = cli.invoke("demo")
    assert result.exit_code == 1 and "[checkpoint.symlink]" in result.stderr
    assert tree_snapshot(outside) == before
    assert partitions(cli) == []


def test_the_writer_refuses_a_link_planted_below_an_unchecked_path(
    tmp_path: Path, outside: Path
) -> None:
    """``write_file_under`` itself walks with no-follow descriptors: a link planted after
    any caller's check (here: with no check at all) is still refused, nothing created."""
    home = tmp_path / "home"
    (home / "projects" / "p").mkdir(parents=True)
    (home / "projects" / "p" / "episodes").symlink_to(outside, target_is_directory=True)
    before = tree_snapshot(outside)
    with pytest.raises(PipelineError) as caught:
        write_file_under(home, home / "projects/p/episodes/e/story.md", b"story\n")
    assert caught.value.code == "checkpoint.symlink"
    assert tree_snapshot(outside) == before
    with pytest.raises(PipelineError) as caught:
        write_file_under(home, home / "projects/p/episodes", b"x")  # the link itself
    assert caught.value.code == "checkpoint.symlink"
    assert (home / "projects" / "p" / "episodes").is_symlink()


# --------------------------------------------------------------------------- the door
def test_an_oversized_story_is_refused_at_the_door(cli: CliEnv) -> None:
    big = cli.root / "big.md"
    big.write_text("The fox ran.\n" * (5 * 1024 * 1024 // 13), encoding="utf-8")  # ~5 MB
    code, output = add_episode(cli, "p1", "e1", big)
    assert code == 1 and "story.max_bytes" in output
    assert f"is {big.stat().st_size} bytes" in output, output  # the file's size, not what was read
    assert not (cli.home / "projects").exists() or not any((cli.home / "projects").rglob("*.md"))
    assert partitions(cli) == []


def test_a_story_with_nul_bytes_is_refused_at_the_door(cli: CliEnv) -> None:
    nul = cli.root / "nul.md"
    nul.write_bytes(b"The fox ran.\x00\nThe crow sang.\n")
    code, output = add_episode(cli, "p1", "e1", nul)
    assert code == 1 and "NUL" in output
    assert partitions(cli) == []


def test_a_story_that_is_not_a_file_says_what_it_is(cli: CliEnv) -> None:
    directory = cli.root / "a-directory"
    directory.mkdir()
    code, output = add_episode(cli, "p1", "e1", directory)
    assert code == 1 and "is a directory" in output and "does not exist" not in output
    code, output = add_episode(cli, "p1", "e1", Path("/dev/zero"))
    assert code == 1 and "character device" in output
    fifo = cli.root / "pipe.md"
    os.mkfifo(fifo)
    done: list[tuple[int, str]] = []
    worker = threading.Thread(target=lambda: done.append(add_episode(cli, "p1", "e1", fifo)))
    worker.start()
    worker.join(timeout=30)
    if worker.is_alive():  # unblock the reader so the test process can end, then fail
        with open(fifo, "wb"):
            pass
        pytest.fail("add-episode opened a FIFO given as the story and hung")
    assert done[0][0] == 1 and "named pipe" in done[0][1]
    assert partitions(cli) == []


def test_the_first_episode_creates_the_home(tmp_path: Path) -> None:
    """A fresh machine: ``PIPELINE_HOME`` does not exist until the first input is added."""
    cli = make_env(tmp_path)
    story = cli.story("fox")
    if cli.home.exists():
        for path in sorted(cli.home.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        cli.home.rmdir()
    code, output = add_episode(cli, "p1", "e1", story)
    assert code == 0, output
    assert (cli.home / "projects" / "p1" / "episodes" / "e1" / "story.md").is_file()
