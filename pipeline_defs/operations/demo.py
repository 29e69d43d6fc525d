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
from resources.checkpoints.published import scratch_cache_of

SAMPLES_DIR = Path(__file__).resolve().parent.parent / "storyboard" / "samples"


def demo_project_yaml() -> bytes:
    """The demo's project file: the samples' ``project.yaml`` if bundled, else defaults."""
    bundled = Path(DataLayout.project_in(SAMPLES_DIR))
    return bundled.read_bytes() if bundled.is_file() else default_project_yaml()


@dataclass(frozen=True)
class EpisodeImages:
    """Where one episode's pictures are, as the operator can reach them after the command:
    its checkpoint folder under the home, or its prefix in the bucket the checkpoints are
    published to (never this process's scratch copy, removed when it exits)."""

    under: str  # the folder, or the bucket URL of the episode's prefix
    files: list[str]  # each picture: relative to the home, or its object's URL
    per_step: dict[str, int]  # step id -> how many pictures


@dataclass
class DemoReport:
    project: str
    episodes: list[dict[str, Any]]
    runs: list[RunReport]
    pictures: dict[str, EpisodeImages]

    @property
    def images(self) -> dict[str, list[str]]:
        return {partition: found.files for partition, found in self.pictures.items()}

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
            "images_under": {p: found.under for p, found in self.pictures.items()},
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


def published_to(ws: Workspace) -> str | None:
    """The bucket the checkpoints (and pictures) are published to; None on a local home."""
    store = ws.checkpoints
    return store.location if scratch_cache_of(store) is not None else None


def episode_images(ws: Workspace, episode: Episode) -> EpisodeImages:
    """Where ``episode``'s pictures are: the PNG files of its checkpoint folder, or, with
    checkpoints published to a bucket, the PNG objects its rows' manifests name."""
    store = ws.checkpoints
    per_step: dict[str, int] = {}
    cache = scratch_cache_of(store)
    if cache is not None:
        under = cache.bucket.episode_prefix(episode.project_id, episode.episode_id)
        named = [
            (step_id, ref.key)
            for step_id, manifest in cache.episode_manifests(
                episode.project_id, episode.episode_id
            ).items()
            for ref in manifest.artifacts.values()
            if ref.key.endswith(".png")
        ]
        for step_id, _ in named:
            per_step[step_id] = per_step.get(step_id, 0) + 1
        files = sorted(cache.object_url(key) for _, key in named)
        return EpisodeImages(cache.object_url(under), files, dict(sorted(per_step.items())))
    folder = Path(store.layout.checkpoint_episode_dir(episode.project_id, episode.episode_id))
    images = list_images(ws, episode)
    for image in images:
        step_id = Path(image).relative_to(folder).parts[0]
        per_step[step_id] = per_step.get(step_id, 0) + 1
    files = [str(Path(i).relative_to(ws.home)) for i in images]
    return EpisodeImages(str(folder), files, per_step)


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
    pictures = {r.partition: episode_images(ws, Episode.parse(r.partition)) for r in runs}
    return DemoReport(project_id, added, runs, pictures)
