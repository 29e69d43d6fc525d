"""``storyboard demo``: a sample project with two episodes, registered and materialized."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline_defs.operations.episodes import add_episode, default_project_yaml
from pipeline_defs.operations.run_report import Progress, RunReport
from pipeline_defs.operations.runs import run_assets
from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import Episode, validate_id

SAMPLES_DIR = Path(__file__).resolve().parent.parent / "storyboard" / "samples"


def demo_project_yaml() -> bytes:
    """The demo's project file: the samples' ``project.yaml`` if bundled, else defaults."""
    bundled = Path(DataLayout.project_in(SAMPLES_DIR))
    return bundled.read_bytes() if bundled.is_file() else default_project_yaml()


@dataclass
class DemoReport:
    project: str
    episodes: list[dict[str, Any]]
    runs: list[RunReport]
    images: dict[str, list[str]]

    @property
    def provider_calls(self) -> int:
        return sum(r.provider_calls for r in self.runs)

    @property
    def success(self) -> bool:
        return all(r.success for r in self.runs)

    @property
    def all_skipped(self) -> bool:
        return all(s.decision == "skip" for r in self.runs for s in r.steps)

    def as_dict(self) -> dict[str, Any]:
        return {
            "project": self.project,
            "episodes": self.episodes,
            "runs": [r.as_dict() for r in self.runs],
            "images": self.images,
            "provider_calls": self.provider_calls,
            "all_skipped": self.all_skipped,
            "success": self.success,
        }


def sample_stories(folder: Path | None = None, count: int = 2) -> dict[str, Path]:
    """Episode id -> story file: the bundled samples, or the first ``count`` *.md of a folder."""
    if folder is None:
        from pipeline_defs.storyboard import sample_stories as bundled

        stories = dict(bundled())
        if len(stories) >= count:
            return dict(list(stories.items())[:count])
        folder = SAMPLES_DIR
    found = sorted(Path(folder).glob("*.md")) if Path(folder).is_dir() else []
    if len(found) < count:
        raise PipelineError(
            ErrorCode.INPUT_INVALID,
            f"need {count} sample stories (*.md) in {folder}, found {len(found)}",
        )
    return {episode_id_for(p): p for p in found[:count]}


def episode_id_for(story: Path) -> str:
    """``01-the-lighthouse.md`` -> ``01-the-lighthouse`` (ids stay within the safe alphabet)."""
    cleaned = "".join(c if c.isalnum() or c in "-_" else "-" for c in story.stem)[:64]
    return validate_id(cleaned or "episode", "episode_id")


def list_images(ws: Workspace, episode: Episode) -> list[str]:
    layout = ws.checkpoints.layout
    root = Path(layout.checkpoint_episode_dir(episode.project_id, episode.episode_id))
    return sorted(
        str(p) for p in root.rglob("*.png") if not layout.is_archived(p.relative_to(root))
    )


def demo(
    ws: Workspace,
    *,
    project_id: str = "demo",
    stories_dir: Path | None = None,
    progress: Callable[[str, Progress], None] | None = None,
) -> DemoReport:
    """Sample project with two episodes, registered and materialized end to end."""
    validate_id(project_id, "project_id")
    if not ws.steps:
        raise PipelineError(
            ErrorCode.INPUT_INVALID,
            "the code location defines no steps (STORYBOARD_STEPS is empty)",
        )
    added = [
        add_episode(
            ws,
            project_id,
            episode_id,
            story,
            keep_existing=True,
            config_template=demo_project_yaml(),
        )
        for episode_id, story in sample_stories(stories_dir).items()
    ]
    runs: list[RunReport] = []
    for entry in added:
        partition = entry["partition"]
        report = (lambda p: lambda item: progress(p, item))(partition) if progress else None
        runs.append(run_assets(ws, partition, progress=report))
    images = {
        r.partition: [
            str(Path(i).relative_to(ws.home)) for i in list_images(ws, Episode.parse(r.partition))
        ]
        for r in runs
    }
    return DemoReport(project_id, added, runs, images)
