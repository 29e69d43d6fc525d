"""The one data layout under PIPELINE_HOME, and the one file identity (no-follow)."""

import os
from pathlib import Path

import pytest

from pipeline_defs.project import project_config_path, project_dir
from pipeline_defs.resume.layout import (
    DataLayout,
    dir_identity,
    dir_stat_identity,
    file_identity,
    stat_identity,
)
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import ResumeSettings
from resources.checkpoints.seal import identity_of, own_identity_of
from resources.checkpoints.store import CheckpointStore


def test_paths_under_the_home() -> None:
    layout = DataLayout("/data/home")
    assert layout.projects == "/data/home/projects"
    assert layout.checkpoints == "/data/home/checkpoints"
    assert layout.ledger_file == "/data/home/ledger.sqlite3"
    assert layout.project_dir("p") == "/data/home/projects/p"
    assert layout.project_file("p") == "/data/home/projects/p/project.yaml"
    assert layout.episodes_dir("p") == "/data/home/projects/p/episodes"
    assert layout.episode_dir("p", "e") == "/data/home/projects/p/episodes/e"
    assert layout.story_file("p", "e") == "/data/home/projects/p/episodes/e/story.md"
    assert layout.checkpoint_project_dir("p") == "/data/home/checkpoints/p"
    assert layout.checkpoint_episode_dir("p", "e") == "/data/home/checkpoints/p/e"
    assert layout.step_dir("p", "e", "s") == "/data/home/checkpoints/p/e/s"


@pytest.mark.parametrize("home", ["/data/home/", "/data//home", "rel/home", "", "/", "./x"])
def test_strings_equal_the_pathlib_joins_they_replace(home: str) -> None:
    layout, base = DataLayout(home), Path(home)
    assert layout.projects == str(base / "projects")
    assert layout.checkpoints == str(base / "checkpoints")
    assert layout.step_dir("p", "e", "s") == str(base / "checkpoints" / "p" / "e" / "s")
    assert layout.episode_dir("p", "e") == str(base / "projects" / "p" / "episodes" / "e")
    assert layout.ledger_file == str(base / "ledger.sqlite3")


def test_every_owner_of_a_path_agrees(tmp_path: Path) -> None:
    layout = DataLayout(str(tmp_path))
    store = CheckpointStore(tmp_path)
    key = StepKey("p", "e", "s")
    assert str(store.root) == layout.checkpoints
    assert str(store.step_dir(key)) == layout.step_dir("p", "e", "s")
    assert str(store.path_for(key)) == layout.step_dir("p", "e", "s") + "/checkpoint.json"
    assert str(project_dir(tmp_path, "p")) == layout.project_dir("p")
    assert str(project_config_path(tmp_path, "p")) == layout.project_file("p")
    settings = ResumeSettings(home=tmp_path)
    assert settings.ledger_url == f"sqlite:///{Path(layout.ledger_file).resolve()}"


def test_identities_are_taken_without_following_links(tmp_path: Path) -> None:
    target = tmp_path / "file.txt"
    target.write_text("x")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    st, own = os.lstat(target), os.lstat(link)
    assert file_identity(target) == stat_identity(st) == (st.st_mtime_ns, st.st_size, st.st_ino)
    assert file_identity(link) == stat_identity(own) != file_identity(target)  # the link's own
    assert dir_identity(tmp_path) == dir_stat_identity(os.lstat(tmp_path))
    assert file_identity(tmp_path / "absent") is None and dir_identity(tmp_path / "nope") is None
    # The store's seals use the same identity (a link of ours is never a match there).
    assert identity_of(target) == file_identity(target) == own_identity_of(target)
    assert identity_of(link) == file_identity(link) and own_identity_of(link) is None
