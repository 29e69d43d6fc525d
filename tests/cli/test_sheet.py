"""``storyboard sheet``: one self-contained HTML page per episode, in story order.

Built on a real run of the ten storyboard steps (offline models); the CLI is invoked as an
operator would, against that home. The page must show every shot and reference picture,
mark a picture whose file no longer matches its checkpoint instead of showing it, name the
steps a fresh partition is missing, and write nothing but ``--out``.
"""

import base64
import io
import json
import re
from collections.abc import Mapping
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from cli_helpers import tree_snapshot
from click.testing import CliRunner
from PIL import Image
from storyboard_support import PARTITION, Env, scratch_dir, write_episode

from pipeline_defs.cli import main
from pipeline_defs.storyboard.thumbnails import THUMBNAIL_SIDE


def sheet(env: Env, out: Path, partition: str = PARTITION) -> dict[str, Any]:
    result = CliRunner().invoke(
        main,
        ["sheet", "--partition", partition, "--out", str(out), "--json"],
        env={"PIPELINE_HOME": str(env.home), "PIPELINE_DB_URL": env.db_url, "DAGSTER_HOME": None},
    )
    assert result.exit_code == 0, (result.output, result.stderr)
    payload: dict[str, Any] = json.loads(result.stdout)
    return payload


def data_of(env: Env, step_id: str) -> Mapping[str, Any]:
    checkpoint = env.checkpoint(step_id)
    assert checkpoint is not None, step_id
    return checkpoint.data


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []
        self.external: list[str] = []
        self.alts: list[str] = []  # as a reader hears them (entities decoded)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.alts += [value or "" for name, value in attrs if name == "alt"]
        for name, value in attrs:
            if name in ("src", "href") and value:
                (self.sources if value.startswith("data:") else self.external).append(value)


def test_the_page_shows_every_shot_and_reference_in_story_order(built: Env, tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    before = tree_snapshot(built.home)
    payload = sheet(built, out)
    assert tree_snapshot(built.home) == before  # nothing written but --out
    page = out.read_text(encoding="utf-8")
    expected_shots = data_of(built, "scene_image_pipeline")["expected"]
    refs = data_of(built, "ref_image_gen")["expected"]
    composites = data_of(built, "composite_image_gen")["expected"]
    assert payload["shots"] == len(expected_shots)
    assert payload["pictures"] == len(expected_shots) + len(refs) + len(composites)
    assert payload["missing_steps"] == [] and payload["problems"] == []
    # story order: the shots appear as scene_detail lists them
    positions = [page.index(f"<b>{item}</b>") for item in expected_shots]
    assert positions == sorted(positions)
    # every prompt is on the page (escaped), and the page is self-contained
    for entry in data_of(built, "scene_detail")["scenes"]:
        for variation in entry["t2i_variations"]:
            assert variation["t2i_prompt"].replace("'", "&#x27;") in page
    images = _Images()
    images.feed(page)
    assert images.external == []
    assert len(images.sources) == payload["pictures"]
    for uri in images.sources:  # thumbnails, bounded in size
        png = base64.b64decode(uri.split(",", 1)[1])
        with Image.open(io.BytesIO(png)) as thumb:
            assert max(thumb.size) <= THUMBNAIL_SIDE


def test_every_picture_has_plain_text_for_alt(built: Env, tmp_path: Path) -> None:
    """An alt attribute is read out as text: the picture's id and what it shows, never the
    caption's markup (``<b>S1_L0_V0</b>``, which the page showed escaped as ``&lt;b&gt;``)."""
    out = tmp_path / "page.html"
    sheet(built, out)
    images = _Images()
    images.feed(out.read_text(encoding="utf-8"))
    assert images.alts and len(images.alts) == len(images.sources)
    marked = [alt for alt in images.alts if re.search(r"[<>]|&\w+;|&#", alt)]
    assert marked == [], marked
    shots = data_of(built, "scene_image_pipeline")["expected"]
    assert [alt for alt in images.alts if alt in shots] == list(shots)
    refs = data_of(built, "ref_image_gen")["expected"]
    assert {f"{cid} reference" for cid in refs} <= set(images.alts), images.alts


def test_a_replaced_picture_is_marked_not_shown(built: Env, tmp_path: Path) -> None:
    env = built.clone()
    try:
        shot = env.step_dir("scene_image_pipeline") / "shots"
        victim = sorted(shot.glob("*.png"))[0]
        other = sorted(shot.glob("*.png"))[1]
        victim.write_bytes(other.read_bytes())  # an older/other copy put in its place
        out = tmp_path / "page.html"
        payload = sheet(env, out)
        page = out.read_text(encoding="utf-8")
        assert "file differs from its checkpoint" in page
        # What the page marks, the JSON lists.
        item = victim.name.removesuffix(".png")
        assert any(
            f"scene_image_pipeline/{item}" in p and "differs from its checkpoint" in p
            for p in payload["problems"]
        ), payload["problems"]
        assert payload["pictures"] == sheet(built, tmp_path / "clean.html")["pictures"] - 1
    finally:
        env.destroy()


def test_a_partition_not_drawn_yet_gets_a_page_naming_the_missing_steps(
    tmp_path: Path,
) -> None:
    env = Env.sqlite(scratch_dir("sheet-new"))
    try:
        write_episode(env.home)
        env.materialize(("story_source",))
        out = tmp_path / "page.html"
        payload = sheet(env, out)
        assert "scene_image_pipeline" in payload["missing_steps"]
        assert "story_source" not in payload["missing_steps"]
        page = out.read_text(encoding="utf-8")
        assert re.search(r"Not drawn yet.*scene_image_pipeline", page)
    finally:
        env.destroy()
