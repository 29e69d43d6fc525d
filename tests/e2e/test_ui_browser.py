"""The Dagster UI in a real browser: a block is explained, a force launches.

``dagster dev`` runs the shipped code location (``workspace.yaml``) on a home made by
``storyboard demo``; the story of ``demo/ep01`` is then edited, so ``story_source`` is blocked
(contract drift) and the resume sensor reports it through a ``resume_report`` run. Chromium
(Debian's package, driven by Playwright for Python) then:

1. opens the asset graph (no community pop-up: ``nux`` is off, as ``make dev`` sets it);
2. opens ``story_source``'s ``resume_integrity`` check and finds the partition, the reason
   and the command to run;
3. opens the materialize dialog, picks ``demo/ep01``, adds the tag ``resume/mode=force`` and
   launches; the forced run must succeed.

Before that, a redraw is launched the same way on ``ref_image_gen`` (tag
``resume/redraw=<item>``): it must succeed and change exactly that picture, and its
materialization's contact sheet (Events tab, ``step/contact_sheet``) must render: a table
with one decoded thumbnail per item and the replaced picture beside the redrawn one.

Before the force, too, the page ``storyboard sheet`` writes for the episode is opened from
disk (``file://``): its scenes and shots in story order, one decoded picture per shot.

Screenshots of each page are written to the test's tmp dir (``-rP`` prints where); the ones
under ``docs/screenshots/`` are copies of them.
``PIPELINE_REQUIRE_BROWSER=1`` (set by ``.ci/run``) makes a missing browser a failure.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
import pytest
from cli_helpers import ROOT
from dagster_dev import dagster_dev, log_tail

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.webserver, pytest.mark.xdist_group("ui_browser")]

CHROMIUM = "/usr/bin/chromium"
PARTITION = "demo/ep01"
TIMEOUT_MS = 60_000
DAGSTER_YAML = "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"  # as `make dev`


def _require_browser() -> bool:
    return os.environ.get("PIPELINE_REQUIRE_BROWSER", "") not in ("", "0", "false")


@dataclass
class Ui:
    url: str
    home: Path
    instance: dg.DagsterInstance
    shots: Path
    log: Path


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    if not Path(CHROMIUM).exists() or shutil.which("chromium") is None:
        message = f"the browser tests need Debian's chromium at {CHROMIUM}"
        if _require_browser():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    root = tmp_path_factory.mktemp("ui")
    home, dagster_home, shots = root / "home", root / "dagster_home", root / "screenshots"
    for folder in (dagster_home, shots):
        folder.mkdir()
    (dagster_home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"
    )
    env = {**os.environ, "PIPELINE_HOME": str(home), "DAGSTER_HOME": str(dagster_home)}
    for name in ("PIPELINE_DB_URL", "STORYBOARD_DEFS"):
        env.pop(name, None)
    storyboard = str(Path(sys.executable).with_name("storyboard"))
    demo = subprocess.run(
        [storyboard, "demo"], env=env, capture_output=True, text=True, timeout=600, cwd=root
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    story = home / "projects" / "demo" / "episodes" / "ep01" / "story.md"
    story.write_text(story.read_text() + "\nA late edit by a writer.\n")
    instance = dg.DagsterInstance.from_config(str(dagster_home))
    log = root / "dagster_dev.log"
    try:
        with dagster_dev(ROOT / "workspace.yaml", env, ROOT, log) as (url, _process):
            yield Ui(url, home, instance, shots, log)
    finally:
        instance.dispose()
    print(f"screenshots: {shots}")


def _wait_for(ui: Ui, what: str, predicate: object, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}\n{log_tail(ui.log)}")


def _block_reported(ui: Ui) -> bool:
    runs = ui.instance.get_runs(dg.RunsFilter(job_name="resume_report"))
    return any(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)


def _launch_with_tag(page: "Page", ui: Ui, asset: str, key: str, value: str, shot: str) -> None:
    """The materialize dialog of ``asset``: partition demo/ep01, one run tag, launch."""
    page.goto(f"{ui.url}/assets/{asset}")
    page.get_by_text("Materialize…").click()
    page.locator("[aria-haspopup=dialog]").filter(has_text="Select a partition").click()
    page.get_by_placeholder("Filter partitions").fill(PARTITION)
    page.locator("[role=menuitem]").filter(has_text=PARTITION).last.click()
    page.keyboard.press("Escape")
    page.get_by_text("Tags", exact=True).click()
    page.get_by_role("button", name="Add tags").click()
    page.get_by_placeholder("Tag Key").fill(key)
    page.get_by_placeholder("Tag Value").fill(value)
    page.get_by_role("button", name="Apply").click()
    page.screenshot(path=str(ui.shots / shot))
    page.get_by_role("button", name="Launch 1 run").click()
    page.wait_for_timeout(2000)


def test_a_redraw_launches_from_the_materialize_dialog(ui: Ui) -> None:
    """tag resume/redraw=<id> on ref_image_gen redraws exactly that picture.

    Runs before the force below (which invalidates every step after story_source)."""
    from playwright.sync_api import sync_playwright

    step_dir = ui.home / "checkpoints" / "demo" / "ep01" / "ref_image_gen"
    checkpoint = json.loads((step_dir / "checkpoint.json").read_text())
    item = checkpoint["data"]["expected"][0]
    target = step_dir / checkpoint["data"]["images"][item]["path"]
    old = target.read_bytes()
    others = {
        p: (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in step_dir.rglob("*.png")
        if p != target and "archive" not in p.parts
    }
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            _launch_with_tag(page, ui, "ref_image_gen", "resume/redraw", item, "5-redraw.png")
        finally:
            browser.close()

    def redrawn() -> list[dg.DagsterRun]:
        runs = ui.instance.get_runs(dg.RunsFilter(tags={"resume/redraw": item}))
        return [r for r in runs if r.tags.get("dagster/partition") == PARTITION]

    _wait_for(ui, "the redraw run", lambda: redrawn() and redrawn()[0].is_finished)
    (run,) = redrawn()
    assert run.status == dg.DagsterRunStatus.SUCCESS, log_tail(ui.log)
    assert run.asset_selection == {dg.AssetKey("ref_image_gen")}
    assert target.read_bytes() != old
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in others} == others
    assert old in [p.read_bytes() for p in (step_dir / "archive").iterdir()]
    _contact_sheet_renders(ui, run, item, len(checkpoint["data"]["expected"]))


def _contact_sheet_renders(ui: Ui, run: dg.DagsterRun, item: str, items: int) -> None:
    """The redraw's materialization: its contact sheet opens from the Events tab and Dagster
    renders it (a table, the data-URI thumbnails decoded), the replaced picture beside the
    new one."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            page.goto(f"{ui.url}/assets/ref_image_gen?view=events")
            expect(page.get_by_text(f"materialized in run {run.run_id[:8]}")).to_be_visible()
            page.get_by_text("[Show Markdown]").first.click()
            dialog = page.get_by_role("dialog")
            expect(dialog.get_by_text("ref_image_gen contact sheet")).to_be_visible()
            images = dialog.locator('img[src^="data:image/png;base64,"]')
            expect(images).to_have_count(items + 1)  # one per item, and the replaced one
            row = dialog.locator("tr").filter(has_text=item)
            expect(row.get_by_text("redrew", exact=True)).to_be_visible()
            expect(row.locator("img")).to_have_count(2)
            decoded = images.evaluate_all("all => all.map(i => i.complete && i.naturalWidth)")
            assert all(decoded), decoded
            page.screenshot(path=str(ui.shots / "6-contact-sheet.png"))
        finally:
            browser.close()


def test_cli_redraw_through_the_webserver(ui: Ui) -> None:
    """``storyboard redraw --graphql``: submitted as ``__ASSET_JOB`` with the redraw tag."""
    step_dir = ui.home / "checkpoints" / "demo" / "ep01" / "composite_image_gen"
    checkpoint = json.loads((step_dir / "checkpoint.json").read_text())
    item = checkpoint["data"]["expected"][-1]
    target = step_dir / checkpoint["data"]["images"][item]["path"]
    old = target.read_bytes()
    env = {
        **os.environ,
        "PIPELINE_HOME": str(ui.home),
        "DAGSTER_HOME": str(ui.instance.root_directory),
    }
    for name in ("PIPELINE_DB_URL", "STORYBOARD_DEFS"):
        env.pop(name, None)
    storyboard = str(Path(sys.executable).with_name("storyboard"))
    done = subprocess.run(
        [storyboard, "redraw", "--partition", PARTITION, "--step", "composite_image_gen",
         "--item", item, "--graphql", ui.url, "--json"],
        env=env, capture_output=True, text=True, timeout=600, cwd=ui.home.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    payload = json.loads(done.stdout)
    assert [(s["step"], s["decision"]) for s in payload["steps"]] == [
        ("composite_image_gen", "redraw_explicit")
    ]
    assert payload["provider_calls"] == 1 and payload["redraw"]["items"] == [item]
    run = ui.instance.get_run_by_id(payload["run_id"])
    assert run is not None and run.tags["resume/redraw"] == item
    assert run.tags["resume/launch_path"] == "cli"
    assert target.read_bytes() != old


def test_the_shared_sheet_opens_in_the_browser_in_story_order(ui: Ui) -> None:
    """``storyboard sheet --out FILE.html`` opened from disk: the page needs no server, and
    shows each scene, in story order, with its shots in order and one decoded picture each.

    Runs before the force below (which archives every checkpoint after story_source)."""
    from playwright.sync_api import expect, sync_playwright

    checkpoints = ui.home / "checkpoints" / "demo" / "ep01"

    def data(step_id: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads((checkpoints / step_id / "checkpoint.json").read_text())
        step_data: dict[str, Any] = found["data"]
        return step_data

    # What the episode holds, read from the checkpoints, not from the page's own code.
    scenes = [f"Scene {s['scene_index']}: {s['heading']}" for s in data("story_source")["scenes"]]
    shots = data("scene_image_pipeline")["expected"]  # every shot, in scene_detail's order
    assert scenes and len(shots) > len(scenes)  # several shots per scene: order means something
    page_file = ui.shots.parent / "sheet.html"
    storyboard = str(Path(sys.executable).with_name("storyboard"))
    env = {**os.environ, "PIPELINE_HOME": str(ui.home)}
    for name in ("PIPELINE_DB_URL", "STORYBOARD_DEFS", "DAGSTER_HOME"):
        env.pop(name, None)
    done = subprocess.run(
        [storyboard, "sheet", "--partition", PARTITION, "--out", str(page_file), "--json"],
        env=env, capture_output=True, text=True, timeout=300, cwd=ui.home.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(done.stdout)["shots"] == len(shots)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            page.goto(page_file.as_uri())
            sections = page.locator("section.scene")
            expect(sections).to_have_count(len(scenes))
            assert sections.locator("h2").all_inner_texts() == scenes
            # Shot ids in the order the page shows them, scene after scene.
            assert sections.locator("figcaption b").all_inner_texts() == shots
            images = sections.locator("img")
            expect(images).to_have_count(len(shots))  # one picture per shot, none missing
            assert sections.locator(".absent").count() == 0
            decoded = images.evaluate_all("all => all.map(i => i.complete && i.naturalWidth)")
            assert all(decoded), decoded
            page.screenshot(path=str(ui.shots / "7-sheet.png"))
        finally:
            browser.close()


def test_a_block_is_explained_and_a_force_launches_from_the_ui(ui: Ui) -> None:
    from playwright.sync_api import expect, sync_playwright

    _wait_for(ui, "the sensor's block report", lambda: _block_reported(ui))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 1000})  # a fresh profile
        page.set_default_timeout(TIMEOUT_MS)
        try:
            # 1. The asset graph, with no community pop-up over it.
            page.goto(f"{ui.url}/asset-groups")
            expect(page.get_by_text("scene_image_pipeline").first).to_be_visible()
            page.wait_for_timeout(2000)  # let the graph finish its layout for the screenshot
            assert page.get_by_text("Join the Dagster community").count() == 0
            page.screenshot(path=str(ui.shots / "1-asset-graph.png"))

            # 2. The blocked partition: reason and the command to run.
            page.goto(f"{ui.url}/assets/story_source?view=checks")
            expect(page.get_by_text("what_to_do")).to_be_visible()
            # The check's description (it said "No description provided").
            expect(page.get_by_text("Fails when the resume judge blocks it")).to_be_visible()
            body = page.inner_text("body")
            assert PARTITION in body
            assert "story.md changed after its checkpoint" in body
            assert f"storyboard force --partition {PARTITION} --step story_source" in body
            page.screenshot(path=str(ui.shots / "2-blocked-check.png"))

            # The asset's description renders its path placeholders.
            page.goto(f"{ui.url}/assets/story_source")
            expect(
                page.get_by_text("projects/{project}/episodes/{episode}/story.md")
            ).to_be_visible()

            # 3. A force from the materialize dialog: partition demo/ep01, tag resume/mode=force.
            _launch_with_tag(page, ui, "story_source", "resume/mode", "force", "3-force-dialog.png")
            page.screenshot(path=str(ui.shots / "4-launched.png"))
        finally:
            browser.close()

    def forced() -> list[dg.DagsterRun]:
        runs = ui.instance.get_runs(dg.RunsFilter(tags={"resume/mode": "force"}))
        return [r for r in runs if r.tags.get("dagster/partition") == PARTITION]

    _wait_for(ui, "the forced run", lambda: forced() and forced()[0].is_finished)
    (run,) = forced()
    assert run.status == dg.DagsterRunStatus.SUCCESS, log_tail(ui.log)
    assert run.asset_selection == {dg.AssetKey("story_source")}
    assert run.tags.get("dagster/from_ui") == "true"
