"""One self-contained HTML page per episode, for the people who judge a storyboard by
looking at it (``storyboard sheet``).

Story order: each scene with its shots (thumbnail, the prompt it was drawn from, the
characters in it), then the characters' reference sheets (reference picture and composites
per outlook). Read through the checkpoint store like every judge: a checkpoint that fails
its integrity checks is reported on the page, never shown as valid; a picture whose bytes
differ from what its checkpoint records is marked, not shown. No model call, no write but
the page itself. A partition that has not drawn yet gets a page saying which steps are
missing, not an error.
"""

import hashlib
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline_defs.operations.workspace import Workspace
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.files import read_nofollow
from pipeline_defs.resume.partition import Episode
from pipeline_defs.steps.redraw import outdated_items
from pipeline_defs.storyboard.thumbnails import data_uri, thumbnail_png
from resources.checkpoints.envelope import Checkpoint

# What the page reads, in story order; a missing one is named on the page.
SHEET_STEPS = (
    "story_source",
    "entity_canon",
    "scene_detail",
    "ref_image_gen",
    "composite_image_gen",
    "scene_image_pipeline",
)


@dataclass(frozen=True)
class Picture:
    """One item of an image step as the page shows it."""

    item_id: str
    step_id: str
    uri: str | None  # the thumbnail; None when the file is absent or not what was recorded
    problem: str | None = None  # why there is no thumbnail
    outdated_from: tuple[str, ...] = ()  # "step/item" redrawn since this was built from it
    older_prompt: bool = False  # drawn from a prompt edited since (accepted or reviewed)


@dataclass
class SheetReport:
    """What ``storyboard sheet`` wrote (the page) and what it found."""

    partition: str
    html: str
    scenes: int = 0
    shots: int = 0
    pictures: int = 0
    missing_steps: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    outdated: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "scenes": self.scenes,
            "shots": self.shots,
            "pictures": self.pictures,
            "missing_steps": self.missing_steps,
            "problems": self.problems,
            "outdated": self.outdated,
        }


class _Reader:
    """The episode's checkpoints and pictures, each read (and verified) once."""

    def __init__(self, ws: Workspace, episode: Episode) -> None:
        self.ws = ws
        self.episode = episode
        self.checkpoints: dict[str, Checkpoint] = {}
        self.missing: list[str] = []
        self.problems: list[str] = []
        known = {step.step_id for step in ws.steps}
        for step_id in SHEET_STEPS:
            if step_id not in known:
                continue
            try:
                found = ws.checkpoints.load(episode.step(step_id))
            except PipelineError as exc:  # shown as a problem, never as valid content
                self.problems.append(f"{step_id}: [{exc.code}] {exc.message}")
                self.missing.append(step_id)
                continue
            if found is None:
                self.missing.append(step_id)
            else:
                self.checkpoints[step_id] = found
        try:
            outdated = outdated_items(ws.steps, ws.checkpoints.load, episode)
        except PipelineError:
            outdated = {}
        self.outdated = {
            (step, item): tuple(sources)
            for step, items in outdated.items()
            for item, sources in items.items()
        }
        self.older_prompts: set[tuple[str, str]] = set()
        for step_id, checkpoint in self.checkpoints.items():
            step = ws.catalog.get(step_id)
            if step is None:
                continue
            try:
                context = ws.judge(step).context(episode.step(step_id))
                items = step.items_from_older_prompts(context, checkpoint)
            except PipelineError:
                continue
            self.older_prompts.update((step_id, item) for item in items)
        # Every picture the page marks (missing, replaced, unreadable), for the JSON too.
        self.marked: list[str] = []

    def data(self, step_id: str) -> Mapping[str, Any]:
        found = self.checkpoints.get(step_id)
        return found.data if found is not None else {}

    def picture(self, step_id: str, item_id: str) -> Picture | None:
        """The item's thumbnail, verified against the sha256 its checkpoint records."""
        checkpoint = self.checkpoints.get(step_id)
        if checkpoint is None:
            return None
        entry = (checkpoint.data.get("images") or {}).get(item_id)
        if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
            return None
        outdated = self.outdated.get((step_id, item_id), ())
        older = (step_id, item_id) in self.older_prompts
        recorded = checkpoint.artifact(entry["path"])
        problem: str | None = None
        uri: str | None = None
        try:
            payload = read_nofollow(
                self.ws.checkpoints.artifact_path(checkpoint.key, entry["path"])
            )
        except FileNotFoundError:
            problem = "file missing"
        except (OSError, PipelineError) as exc:
            problem = f"unreadable ({exc})"
        else:
            if recorded is None or hashlib.sha256(payload).hexdigest() != recorded.sha256:
                problem = "file differs from its checkpoint"
            else:
                try:
                    uri = data_uri(thumbnail_png(payload, name=f"{step_id}/{entry['path']}"))
                except PipelineError as exc:
                    problem = exc.message
        if problem is not None:
            self.marked.append(f"{step_id}/{item_id}: {problem}")
        return Picture(item_id, step_id, uri, problem, outdated, older)


def build_sheet(ws: Workspace, episode: Episode) -> SheetReport:
    """The episode's page (HTML text) and what it holds."""
    reader = _Reader(ws, episode)
    report = SheetReport(episode.partition_key, "", missing_steps=list(reader.missing))
    report.problems = list(reader.problems)
    body: list[str] = []
    story = reader.data("story_source")
    title = str(story.get("title") or episode.partition_key)
    if reader.missing:
        body.append(
            '<p class="missing">Not drawn yet, or not readable: '
            + ", ".join(f"<code>{_e(s)}</code>" for s in reader.missing)
            + " (run <code>storyboard status --partition "
            + _e(episode.partition_key)
            + "</code> to see why).</p>"
        )
    for problem in reader.problems:
        body.append(f'<p class="problem">{_e(problem)}</p>')
    names = _character_names(reader.data("entity_canon"))
    headings = {
        int(s.get("scene_index", 0)): str(s.get("heading") or "")
        for s in story.get("scenes") or []
        if isinstance(s, Mapping)
    }
    shots_by_scene: dict[int, list[str]] = {}
    for entry_index, entry in enumerate(reader.data("scene_detail").get("scenes") or []):
        if not isinstance(entry, Mapping):
            continue
        scene_index = int(entry.get("scene_index", 0))
        shots_by_scene.setdefault(scene_index, [])
        for variation in entry.get("t2i_variations") or []:
            if not isinstance(variation, Mapping):
                continue
            item = f"S{scene_index}_L{entry_index}_V{int(variation.get('variation_index', 0))}"
            shots_by_scene[scene_index].append(
                _shot_card(reader, item, entry, variation, names, report)
            )
            report.shots += 1
    for scene_index in sorted(shots_by_scene or dict.fromkeys(headings)):
        report.scenes += 1
        heading = headings.get(scene_index) or f"Scene {scene_index}"
        cards = shots_by_scene.get(scene_index) or ['<p class="missing">no shots yet</p>']
        body.append(
            f'<section class="scene"><h2>Scene {scene_index}: {_e(heading)}</h2>'
            f'<div class="grid">{"".join(cards)}</div></section>'
        )
    body.append(_characters(reader, report))
    report.problems += reader.marked
    report.outdated = sorted(f"{s}/{i}" for s, i in set(reader.outdated) | reader.older_prompts)
    report.html = _page(f"{title} — {episode.partition_key}", title, episode, "".join(body))
    return report


def write_sheet(report: SheetReport, out: Path) -> Path:
    """Write the page (atomically: a reader never sees half a page)."""
    target = Path(out)
    temp = target.with_name(f".{target.name}.tmp")
    temp.write_text(report.html, encoding="utf-8")
    temp.replace(target)
    return target


# ----------------------------------------------------------------------------- parts
def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _character_names(canon: Mapping[str, Any]) -> dict[str, str]:
    return {
        str(c.get("character_id")): str(c.get("name") or c.get("character_id"))
        for c in canon.get("characters") or []
        if isinstance(c, Mapping)
    }


def _figure(picture: Picture | None, label: str, words: str = "", detail: str = "") -> str:
    """One picture: ``label`` (its id, in bold) and ``words`` (what it shows) as its caption,
    and the same as plain text for its ``alt`` (read out as text: no markup)."""
    plain = f"{label} {words}".strip()
    caption = f"<b>{_e(label)}</b>" + (f" {_e(words)}" if words else "")
    if picture is not None and picture.uri is not None:
        image = f'<img src="{picture.uri}" alt="{_e(plain)}">'
    else:
        why = picture.problem if picture is not None else "not drawn yet"
        image = f'<div class="absent">{_e(why)}</div>'
    flag = ""
    if picture is not None and picture.older_prompt:
        flag += '<p class="outdated">outdated: drawn from an older prompt (edited since)</p>'
    if picture is not None and picture.outdated_from:
        flag += (
            '<p class="outdated">outdated: built from '
            + ", ".join(_e(s) for s in picture.outdated_from)
            + ", redrawn since</p>"
        )
    return f"<figure>{image}<figcaption>{caption}{flag}{detail}</figcaption></figure>"


def _shot_card(
    reader: _Reader,
    item: str,
    entry: Mapping[str, Any],
    variation: Mapping[str, Any],
    names: Mapping[str, str],
    report: SheetReport,
) -> str:
    picture = reader.picture("scene_image_pipeline", item)
    if picture is not None and picture.uri is not None:
        report.pictures += 1
    cast = [
        names.get(str(c.get("character_id")), str(c.get("character_id")))
        for c in entry.get("characters") or []
        if isinstance(c, Mapping)
    ]
    detail = f'<p class="prompt">{_e(variation.get("t2i_prompt") or "")}</p>' + (
        f'<p class="cast">{_e(", ".join(cast))}</p>' if cast else ""
    )
    return _figure(picture, item, detail=detail)


def _characters(reader: _Reader, report: SheetReport) -> str:
    canon = reader.data("entity_canon")
    cards: list[str] = []
    for character in canon.get("characters") or []:
        if not isinstance(character, Mapping):
            continue
        cid = str(character.get("character_id"))
        figures: list[Picture | None] = [reader.picture("ref_image_gen", cid)]
        captions = [(cid, "reference")]
        for outlook in character.get("outlooks") or []:
            oid = str(outlook.get("outlook_id")) if isinstance(outlook, Mapping) else ""
            if not oid or oid == "O00":
                continue
            figures.append(reader.picture("composite_image_gen", f"{cid}_{oid}"))
            captions.append((f"{cid}_{oid}", str(outlook.get("description") or "")))
        report.pictures += sum(1 for f in figures if f is not None and f.uri is not None)
        grid = "".join(_figure(f, *c) for f, c in zip(figures, captions, strict=True))
        cards.append(
            f'<section class="character"><h3>{_e(character.get("name") or cid)} '
            f"<small>{_e(cid)} · {_e(character.get('description') or '')}</small></h3>"
            f'<div class="grid">{grid}</div></section>'
        )
    if not cards:
        return ""
    return "<h2>Characters</h2>" + "".join(cards)


_STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#222;background:#fafafa}
h1{margin-bottom:.2rem}.sub{color:#666;margin-top:0}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:1rem}
figure{margin:0;background:#fff;border:1px solid #ddd;border-radius:6px;padding:.5rem}
figure img{width:100%;height:auto;display:block}
figcaption{font-size:.8rem;margin-top:.4rem}
.prompt{color:#444;margin:.3rem 0}.cast{color:#06c;margin:.2rem 0}
.absent{height:100px;display:flex;align-items:center;justify-content:center;
background:#eee;color:#900;font-size:.8rem;text-align:center}
.outdated{color:#b60;font-weight:bold;margin:.2rem 0}
.missing,.problem{background:#fff3cd;border:1px solid #e0c36a;padding:.5rem;border-radius:4px}
section{margin-bottom:1.5rem}
"""


def _page(head_title: str, title: str, episode: Episode, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{_e(head_title)}</title>'
        f"<style>{_STYLE}</style></head><body>"
        f"<h1>{_e(title)}</h1>"
        f'<p class="sub">storyboard of <code>{_e(episode.partition_key)}</code></p>'
        f"{body}</body></html>\n"
    )


def sheet_summary_lines(report: SheetReport, out: Path) -> Sequence[str]:
    """What the CLI prints after writing the page."""
    lines = [
        f"wrote {out}: {report.scenes} scenes, {report.shots} shots, "
        f"{report.pictures} pictures shown"
    ]
    if report.missing_steps:
        lines.append("not drawn yet (or unreadable): " + ", ".join(report.missing_steps))
    lines += [f"problem: {p}" for p in report.problems]
    if report.outdated:
        lines.append(
            "outdated (drawn from an older prompt, or built from a picture redrawn since): "
            + ", ".join(report.outdated)
        )
    return lines
