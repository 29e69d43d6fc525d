"""The contact sheet on the asset page: each image step's materialization carries its
pictures as markdown, thumbnails as ``data:image/png;base64,…`` images.

Through real Dagster runs of the sample episode (offline models): one thumbnail per item with
its id, what the run did with it (drew, reused, redrew) and its prompt; a SKIP carries no
sheet; a redraw shows the replaced picture beside the new one; an episode with many shots
stays under the event's byte bound and names the items it left out. The markdown builder is
also tested on its own (escaping, ranking, pictures it cannot show).
"""

import base64
import functools
import io
import re
from dataclasses import dataclass
from random import Random
from typing import Any

import dagster as dg
import pytest
from PIL import Image
from storyboard_support import TEST_CONFIG, Env, RunOutcome, scratch_dir, write_episode

from pipeline_defs.resume.decision_types import ResumeAction
from pipeline_defs.resume.layout import ARCHIVE_DIR
from pipeline_defs.steps.redraw import REDRAW_TAG
from pipeline_defs.storyboard.contact_sheet import (
    LEFT_OUT_RESERVE,
    MAX_EVENT_BYTES,
    MAX_SHEET_BYTES,
    MAX_THUMBNAIL_BYTES,
    ItemAction,
    SheetItem,
    build_contact_sheet,
    sheet_bytes,
    thumbnail,
)
from pipeline_defs.storyboard.scene_detail import item_id
from pipeline_defs.storyboard.thumbnails import THUMBNAIL_SIDE

IMAGE_STEPS = ("ref_image_gen", "composite_image_gen", "scene_image_pipeline")
SHEET_KEY = "step/contact_sheet"
DATA_IMAGE = re.compile(r"!\[((?:\\.|[^\]\\])*)\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)")
LEFT_OUT = re.compile(r"^(\d+) more items not shown: (.*)$", re.MULTILINE)


# ----------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class Row:
    """One table row of a sheet: its cells as markdown, and its images (alt, PNG)."""

    item: str
    action: str
    cells: tuple[str, ...]
    images: tuple[tuple[str, bytes], ...]


def unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def split_cells(line: str) -> tuple[str, ...]:
    """Cells of a table row; an escaped ``\\|`` stays inside its cell."""
    return tuple(c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1])


def rows(markdown: str) -> dict[str, Row]:
    """The sheet's item rows, by item id (the header and its rule are not items)."""
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    out: dict[str, Row] = {}
    for line in lines[1:]:  # lines[0] is the header; the rule starts with "|---"
        cells = split_cells(line)
        images = tuple(
            (unescape(alt), base64.b64decode(data)) for alt, data in DATA_IMAGE.findall(line)
        )
        item = unescape(cells[0])
        assert item not in out, f"{item} listed twice"
        out[item] = Row(item, cells[1], cells, images)
    return out


def header(markdown: str) -> tuple[str, ...]:
    return split_cells(next(line for line in markdown.splitlines() if line.startswith("| ")))


def events(outcome: RunOutcome) -> dict[str, dg.DagsterEvent]:
    return {
        e.step_materialization_data.materialization.asset_key.path[-1]: e
        for e in outcome.result.get_asset_materialization_events()
    }


def metadata_of(event: dg.DagsterEvent) -> dict[str, Any]:
    return dict(event.step_materialization_data.materialization.metadata)


def sheet_of(outcome: RunOutcome, step_id: str) -> str:
    value = metadata_of(events(outcome)[step_id]).get(SHEET_KEY)
    assert isinstance(value, dg.MarkdownMetadataValue), f"{step_id}: no markdown sheet: {value!r}"
    assert value.md_str is not None
    return value.md_str


def expected(env: Env, step_id: str) -> list[str]:
    checkpoint = env.checkpoint(step_id)
    assert checkpoint is not None
    return [str(i) for i in checkpoint.data["expected"]]


def picture(env: Env, step_id: str, item: str) -> bytes:
    checkpoint = env.checkpoint(step_id)
    assert checkpoint is not None
    path: str = checkpoint.data["images"][item]["path"]
    return (env.step_dir(step_id) / path).read_bytes()


def thumb_of(png: bytes) -> bytes:
    found = thumbnail(png, name="test")
    assert found is not None
    return found


def assert_thumbnail(png: bytes) -> None:
    assert len(png) <= MAX_THUMBNAIL_BYTES
    with Image.open(io.BytesIO(png)) as image:
        assert image.format == "PNG" and max(image.size) <= THUMBNAIL_SIDE


# ----------------------------------------------------------------------------- templates
def first_run(built: Env) -> RunOutcome:
    """The run that built the template (``built``, tests/conftest.py), with its events."""
    assert built.first is not None
    return built.first


# ----------------------------------------------------------------------------- through Dagster
@pytest.mark.parametrize("step_id", IMAGE_STEPS)
def test_a_first_run_shows_every_picture_it_drew(built: Env, step_id: str) -> None:
    env, markdown = built, sheet_of(first_run(built), step_id)
    items = expected(env, step_id)
    found = rows(markdown)
    assert list(found) == items  # one row per item, in the step's own order
    assert len(DATA_IMAGE.findall(markdown)) == len(items)
    assert header(markdown) == ("item", "this run", "picture", "drawn from")
    assert not LEFT_OUT.search(markdown)
    for item, row in found.items():
        assert row.action == ItemAction.DREW.value
        ((alt, png),) = row.images
        assert alt == item
        assert_thumbnail(png)
        assert png == thumb_of(picture(env, step_id, item))  # that item's picture
        assert unescape(row.cells[-1]).strip(), f"{item}: no prompt"
    assert sheet_bytes(markdown) <= MAX_SHEET_BYTES


def test_the_prompt_each_shot_was_drawn_from_is_shown_shortened(built: Env) -> None:
    found = rows(sheet_of(first_run(built), "scene_image_pipeline"))
    scenes = built.checkpoint("scene_detail")
    assert scenes is not None
    for list_index, entry in enumerate(scenes.data["scenes"]):
        for variation in entry["t2i_variations"]:
            item = item_id(entry["scene_index"], list_index, variation["variation_index"])
            shown = unescape(found[item].cells[-1])
            assert " ".join(variation["t2i_prompt"].split())[:60] in shown
            assert len(shown) <= 160


def test_steps_without_pictures_carry_no_sheet(built: Env) -> None:
    for step_id, event in events(first_run(built)).items():
        if step_id not in IMAGE_STEPS:
            assert SHEET_KEY not in metadata_of(event), step_id


def test_a_resume_says_which_pictures_it_drew_and_which_it_reused(env: Env) -> None:
    step_id = "scene_image_pipeline"
    items = expected(env, step_id)
    lost = items[2]
    target = env.step_dir(step_id) / "shots" / f"{lost}.png"
    target.unlink()  # one picture lost: the resume draws it and reuses the rest
    outcome = env.materialize([step_id])
    assert outcome.calls_of(step_id, "image") == 1
    markdown = sheet_of(outcome, step_id)
    found = rows(markdown)
    assert list(found) == items
    assert {i: r.action for i, r in found.items()} == {
        i: (ItemAction.DREW if i == lost else ItemAction.REUSED).value for i in items
    }
    assert all(len(r.images) == 1 for r in found.values())
    assert f"{len(items)} items (1 drew, {len(items) - 1} reused)" in markdown


def test_a_skip_carries_no_sheet(env: Env) -> None:
    outcome = env.materialize()
    assert set(outcome.decisions.values()) == {ResumeAction.SKIP.value}
    for step_id in IMAGE_STEPS:
        metadata = metadata_of(events(outcome)[step_id])
        assert metadata["resume/decision"].value == ResumeAction.SKIP.value
        assert SHEET_KEY not in metadata
        assert not any(isinstance(v, dg.MarkdownMetadataValue) for v in metadata.values())


@pytest.mark.parametrize("step_id", IMAGE_STEPS)
def test_a_redraw_shows_the_replaced_picture_beside_the_new_one(env: Env, step_id: str) -> None:
    items = expected(env, step_id)
    item = items[0]
    old = picture(env, step_id, item)
    outcome = env.materialize([step_id], tags={REDRAW_TAG: item})
    assert outcome.decisions == {step_id: ResumeAction.REDRAW_EXPLICIT.value}
    new = picture(env, step_id, item)
    assert new != old
    archived = [p.read_bytes() for p in (env.step_dir(step_id) / ARCHIVE_DIR).iterdir()]
    assert old in archived
    markdown = sheet_of(outcome, step_id)
    assert header(markdown) == ("item", "this run", "replaced", "picture", "drawn from")
    found = rows(markdown)
    assert list(found) == items
    redrawn = found[item]
    assert redrawn.action == ItemAction.REDREW.value
    (before_alt, before), (after_alt, after) = redrawn.images  # side by side, old first
    assert (before_alt, after_alt) == (f"{item} before", item)
    assert before == thumb_of(old) and after == thumb_of(new) and before != after
    for other in items[1:]:
        assert found[other].action == ItemAction.REUSED.value
        assert len(found[other].images) == 1 and found[other].cells[2] == ""


def test_many_shots_stay_under_the_event_bound_and_name_what_is_left_out() -> None:
    # 4 scenes x 12 shots x 4 variations: more pictures than fit even at the smallest
    # shared thumbnail bound, so some must be left out. Some 200 calls: past the default spend
    # cap of 200 per episode (docs/DESIGN.md#spend-cap), so this project raises its own.
    config = {
        **TEST_CONFIG,
        "scenes": {"shots_per_scene": 12, "variations_per_shot": 4},
        "budget": {"max_calls_per_episode": 400},
    }
    env = Env.sqlite(scratch_dir("contact-sheet-many"))
    try:
        write_episode(env.home, config=config)
        outcome = env.materialize()
        step_id = "scene_image_pipeline"
        items = expected(env, step_id)
        assert len(items) >= 150
        for name, event in events(outcome).items():  # the whole event, as the log stores it
            assert len(dg.serialize_value(event).encode()) <= MAX_EVENT_BYTES, name
        markdown = sheet_of(outcome, step_id)
        assert sheet_bytes(markdown) <= MAX_SHEET_BYTES
        found = rows(markdown)
        shown = list(found)
        assert 0 < len(shown) < len(items)
        assert shown == [i for i in items if i in found]  # still in story order
        assert len(DATA_IMAGE.findall(markdown)) == len(shown)
        for row in found.values():
            ((_alt, png),) = row.images
            assert_thumbnail(png)
        match = LEFT_OUT.search(markdown)
        assert match is not None, markdown[-500:]
        left_out = [i for i in items if i not in found]
        assert int(match.group(1)) == len(left_out)
        named = [unescape(i) for i in re.findall(r"S\d+\\_L\d+\\_V\d+", match.group(2))]
        assert named == left_out
    finally:
        env.destroy()


# ----------------------------------------------------------------------------- the builder
def _png(size: tuple[int, int] = (384, 256), *, photo: int | None = None) -> bytes:
    """A flat picture, or (``photo`` = a seed) one that compresses as badly as a photograph:
    smooth random colours."""
    if photo is None:
        image = Image.new("RGB", size, "teal")
    else:
        cells = Image.frombytes("RGB", (48, 32), Random(photo).randbytes(48 * 32 * 3))
        image = cells.resize(size, Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=1)  # fast: only the pixels matter here
    return out.getvalue()


def test_a_prompt_stays_in_its_cell_and_is_shortened() -> None:
    prompt = "a | b * c _d_ [link](x) <b>bold</b>\nnext line " + "word " * 80
    sheet = build_contact_sheet(
        "t", [SheetItem("X1", ItemAction.DREW, prompt, lambda: _png((64, 64)))]
    )
    (row,) = rows(sheet.markdown).values()
    assert len(row.cells) == 4 and len(row.images) == 1
    shown = unescape(row.cells[-1])
    assert shown.startswith("a | b * c _d_ [link](x) <b>bold</b> next line word")
    assert shown.endswith("…") and len(shown) <= 160
    assert "\n" not in row.cells[-1]


def test_a_full_sheet_shows_what_the_run_changed_first() -> None:
    png = _png()
    loaded: list[str] = []

    def loader(name: str) -> SheetItem:
        def load() -> bytes:
            loaded.append(name)
            return png

        action = ItemAction.DREW if name == "I9" else ItemAction.REUSED
        return SheetItem(name, action, f"prompt {name}", load)

    items = [loader(f"I{n}") for n in range(10)]
    whole = build_contact_sheet("t", items).markdown
    assert not LEFT_OUT.search(whole)
    lines = [f"{line}\n" for line in whole.splitlines()]
    head = sum(sheet_bytes(line) for line in lines if not line.startswith("| I"))
    row = max(sheet_bytes(line) for line in lines if line.startswith("| I"))
    loaded.clear()
    # room for the header, the reserve kept for the left-out line and three rows
    sheet = build_contact_sheet("t", items, max_bytes=head + LEFT_OUT_RESERVE + 3 * row)
    assert sheet.shown == ("I0", "I1", "I9")  # the drawn one first, shown in item order
    assert sheet.left_out == tuple(f"I{n}" for n in range(2, 9))
    assert "7 more items not shown: I2, I3, I4, I5, I6, I7, I8" in sheet.markdown
    assert loaded == ["I9", "I0", "I1", "I2"]  # what does not fit is not read further


def test_many_items_get_smaller_thumbnails_rather_than_fewer() -> None:
    pictures = [_png((480, 320), photo=n) for n in range(40)]
    items = [
        SheetItem(f"I{n}", ItemAction.DREW, "p", functools.partial(bytes, png))
        for n, png in enumerate(pictures)
    ]
    full = [thumb_of(png) for png in pictures]
    assert sum(len(t) * 4 // 3 for t in full) > MAX_SHEET_BYTES  # at full size, some left out
    sheet = build_contact_sheet("t", items)
    assert sheet.left_out == () and len(sheet.shown) == len(items)
    found = rows(sheet.markdown)
    for item, thumb in zip(items, full, strict=True):
        ((_alt, png),) = found[item.item_id].images
        assert len(png) < len(thumb)  # shrunk to share the sheet
    assert sheet_bytes(sheet.markdown) <= MAX_SHEET_BYTES


def test_a_picture_it_cannot_show_is_named_not_raised() -> None:
    def gone() -> bytes:
        raise FileNotFoundError("shots/S1_L0_V0.png")

    sheet = build_contact_sheet(
        "t",
        [
            SheetItem("A", ItemAction.DREW, "p", gone),
            SheetItem("B", ItemAction.REUSED, "p", lambda: b"not a png"),
            SheetItem("C", ItemAction.FAILED, "p", note="reference image of C01 is missing"),
        ],
    )
    found = rows(sheet.markdown)
    assert "no thumbnail" in found["A"].cells[2] and "no thumbnail" in found["B"].cells[2]
    assert unescape(found["C"].cells[2]) == "reference image of C01 is missing"
    assert not any(r.images for r in found.values())
    assert "3 items (1 drew, 1 reused, 1 failed)" in sheet.markdown


def test_a_photograph_is_shrunk_to_the_thumbnail_bound() -> None:
    big = _png((1024, 1024), photo=7)
    assert len(big) > 50 * MAX_THUMBNAIL_BYTES
    assert_thumbnail(thumb_of(big))
