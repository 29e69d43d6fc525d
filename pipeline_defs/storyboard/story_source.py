"""story_source: the episode's story file, checked, normalized and cut into scenes.

The story is the one input a user edits by hand. Its sha256 is recorded so that an edit
after the checkpoint is seen as contract drift (a BLOCK naming the file and both hashes)
instead of being silently ignored or silently re-run into a new storyboard.
"""

import hashlib
import re
import unicodedata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline_defs.project import StoryKnobs, refuse_input_links
from pipeline_defs.resume.completion import CompletionReport, Origin
from pipeline_defs.resume.errors import Code, PipelineError
from pipeline_defs.resume.files import read_nofollow
from pipeline_defs.resume.layout import STORY_FILE, DataLayout
from pipeline_defs.steps.context import StepContext, VerifyContext
from pipeline_defs.steps.spec import Step, StepResult
from resources.checkpoints.envelope import Checkpoint, sha256_text


class StorySourceCode(Code):
    """The step's own error codes."""

    INVALID_INPUT = "story_source.invalid_input", 400


INVALID_INPUT = StorySourceCode.INVALID_INPUT
# Control characters other than tab/newline/CR mark a binary file, not prose.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def story_path(ctx: VerifyContext) -> Path:
    return Path(DataLayout.story_in(ctx.episode_dir))


def _invalid(path: Path, problem: str) -> PipelineError:
    return PipelineError(
        INVALID_INPUT, f"story file {path}: {problem}", status=400, details={"path": str(path)}
    )


def read_story(path: Path, knobs: StoryKnobs) -> tuple[bytes, str, dict[str, Any]]:
    """Raw bytes, normalized text and parse of the episode's story, or a clear error naming
    the file and what is wrong."""
    if not path.is_file():
        raise _invalid(path, "is missing (add it with `storyboard add-episode`)")
    size = path.stat().st_size
    if size > knobs.max_bytes:
        raise _invalid(
            path, f"is {size} bytes, over the story.max_bytes limit of {knobs.max_bytes}"
        )
    raw = read_nofollow(path)  # a link raced in since the caller's check is refused too
    return (raw, *accept_story(path, raw, knobs))


def accept_story(
    path: Path, raw: bytes, knobs: StoryKnobs, *, file_size: int = 0
) -> tuple[str, dict[str, Any]]:
    """Normalized text and parse of ``raw`` if it is a story this step accepts; else a typed
    error naming ``path``. The one definition of an acceptable story: ``storyboard
    add-episode`` applies it at the door, so nothing is registered that this step would
    refuse later. ``file_size``: the size of the file ``raw`` was read from, when the reader
    stopped at the limit (a refusal says the file's size, not the bytes read)."""
    size = max(len(raw), file_size)
    if size > knobs.max_bytes:
        raise _invalid(
            path, f"is {size} bytes, over the story.max_bytes limit of {knobs.max_bytes}"
        )
    if b"\x00" in raw:
        raise _invalid(path, "is binary (contains NUL bytes), not a text story")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(path, f"is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if _CONTROL.search(text):
        raise _invalid(path, "contains control characters; it looks binary, not a text story")
    if not text.strip():
        raise _invalid(path, "is empty")
    normalized = normalize(text)
    parsed = parse_story(normalized, knobs.segment_chars)
    if not any(segment["text"] for segment in parsed["segments"]):
        raise _invalid(path, "has headings but no story text")
    return normalized, parsed


def normalize(text: str) -> str:
    """NFC, Unix newlines, no BOM, no trailing spaces, at most one blank line in a row."""
    text = unicodedata.normalize("NFC", text.removeprefix("\ufeff"))
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def _paragraphs(body: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", body) if p.strip()]


def _chunks(paragraphs: list[str], limit: int) -> list[str]:
    """Group paragraphs up to ``limit`` characters; a long paragraph stands alone."""
    out: list[str] = []
    current: list[str] = []
    for paragraph in paragraphs:
        if current and len("\n\n".join([*current, paragraph])) > limit:
            out.append("\n\n".join(current))
            current = []
        current.append(paragraph)
    if current:
        out.append("\n\n".join(current))
    return out


def parse_story(text: str, segment_chars: int) -> dict[str, Any]:
    """Title (``# ``), scenes (``## `` headings, else paragraph groups) and segments."""
    title: str | None = None
    sections: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.split("\n"):
        prologue = len(sections) == 1 and not any(x.strip() for x in sections[0][1])
        if line.startswith("# ") and title is None and prologue:
            title = line[2:].strip()
        elif line.startswith("## "):
            sections.append((line[3:].strip(), []))
        else:
            sections[-1][1].append(line)
    bodies = [(heading, "\n".join(lines).strip()) for heading, lines in sections]
    bodies = [(h, b) for h, b in bodies if b or h]
    if len(bodies) == 1 and bodies[0][0] is None:
        # No headings: every paragraph group becomes a scene of its own.
        groups = _chunks(_paragraphs(bodies[0][1]), segment_chars)
        bodies = [(f"Part {i}", body) for i, body in enumerate(groups, start=1)]
    scenes: list[dict[str, Any]] = []
    segments: list[dict[str, Any]] = []
    for scene_index, (heading, body) in enumerate(bodies, start=1):
        indices = []
        for chunk in _chunks(_paragraphs(body), segment_chars) or [""]:
            indices.append(len(segments))
            segments.append(
                {
                    "segment_index": len(segments),
                    "scene_index": scene_index,
                    "text": chunk,
                    "sha256": sha256_text(chunk),
                }
            )
        scenes.append(
            {
                "scene_index": scene_index,
                "heading": heading or title or "Opening",
                "text": body,
                "segment_indices": indices,
            }
        )
    return {"title": title, "scenes": scenes, "segments": segments}


class StorySource(Step):
    step_id = "story_source"
    deps = ()
    schema_version = 1
    resume_config_keys = ("story.segment_chars",)
    # No angle brackets: the Dagster UI renders descriptions as Markdown (HTML tags vanish).
    description = (
        "Reads projects/{project}/episodes/{episode}/story.md; normalized text, scenes, segments."
    )

    def execute(self, ctx: StepContext, inputs: Mapping[str, Checkpoint]) -> StepResult:
        path = story_path(ctx)
        refuse_input_links(ctx.home, path)  # never read through a link (docs/DESIGN.md#no-escape)
        raw, normalized, parsed = read_story(path, ctx.project.story)
        data = {
            "story_file": STORY_FILE,
            "story_sha256": hashlib.sha256(raw).hexdigest(),
            "bytes": len(raw),
            "word_count": len(normalized.split()),
            "text": normalized,
            **parsed,
        }
        return StepResult(
            data=data,
            summary=f"{len(parsed['scenes'])} scenes, {len(parsed['segments'])} segments, "
            f"{data['word_count']} words",
            metadata={"scenes": len(parsed["scenes"]), "words": data["word_count"]},
        )

    def verify_completion(self, ctx: VerifyContext, checkpoint: Checkpoint) -> CompletionReport:
        """The story on disk must still be the story this checkpoint was made from."""
        path = story_path(ctx)
        try:
            refuse_input_links(ctx.home, path)
        except PipelineError as exc:  # a link in the story's place: a block naming it
            return CompletionReport.incomplete(Origin.CONTRACT_DRIFT, (exc.message,))
        recorded = checkpoint.data.get("story_sha256")
        if not isinstance(recorded, str):
            return CompletionReport.incomplete(
                Origin.CONTRACT_DRIFT, (f"{path}: checkpoint records no story_sha256",)
            )
        if not path.is_file():
            return CompletionReport.incomplete(
                Origin.CONTRACT_DRIFT,
                (f"story file {path} is missing (checkpoint recorded sha256 {recorded})",),
            )
        current = hashlib.sha256(read_nofollow(path)).hexdigest()
        if current != recorded:
            return CompletionReport.incomplete(
                Origin.CONTRACT_DRIFT,
                (
                    f"story file {path} changed after its checkpoint: sha256 {recorded} "
                    f"recorded, {current} now",
                ),
                story_path=str(path),
                recorded_sha256=recorded,
                current_sha256=current,
            )
        return CompletionReport.clean()
