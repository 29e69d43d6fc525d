"""``storyboard demo``: two episodes end to end; the second run costs zero provider calls."""

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_helpers import CliEnv
from s3_server import S3Server

from pipeline_defs.resume.layout import SCRATCH_DIR
from pipeline_defs.storyboard import STORYBOARD_STEPS


def test_demo_on_test_steps_resumes_for_free(cli: CliEnv) -> None:
    stories = cli.root / "stories"
    cli.story("fox"), cli.story("ship")
    first = cli.invoke("demo", "--stories", str(stories))
    assert first.exit_code == 0, first.output
    text = first.stdout
    assert text.count("  ok   ") == 8, "one progress line per asset and episode"
    assert "episode demo/fox" in text and "episode demo/ship" in text
    assert "provider calls this run: 12" in text
    assert "images: 3 PNG under" in text

    calls_before = len(cli.ledger.provider_calls())
    second = cli.invoke("demo", "--stories", str(stories))
    assert second.exit_code == 0, second.output
    assert "0 provider calls: every step was SKIP" in second.stdout
    assert second.stdout.count(" skip ") >= 8
    assert len(cli.ledger.provider_calls()) == calls_before


def test_demo_refuses_without_two_stories(cli: CliEnv) -> None:
    result = cli.invoke("demo", "--stories", str(cli.root))
    assert result.exit_code == 1
    assert "need 2 sample stories" in result.stderr


@pytest.mark.skipif(not STORYBOARD_STEPS, reason="the storyboard steps are not defined yet")
def test_demo_on_the_real_pipeline_second_run_has_zero_provider_calls(cli: CliEnv) -> None:
    """The README's first command, as a user runs it: the console script, default defs."""
    env = cli.subprocess_env()
    env.pop("STORYBOARD_DEFS")
    script = str(Path(sys.executable).with_name("storyboard"))
    first = subprocess.run([script, "demo"], env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert first.stdout.count("  ok   ") == 2 * len(STORYBOARD_STEPS)
    assert "provider calls this run: 0" not in first.stdout
    for step in STORYBOARD_STEPS:
        assert step.step_id in first.stdout
    assert "scene_image_pipeline/" in first.stdout, "says where the images are"

    second = subprocess.run(
        [script, "demo", "--json"], env=env, capture_output=True, text=True, timeout=600
    )
    assert second.returncode == 0, second.stderr[-3000:]
    payload = json.loads(second.stdout)
    assert payload["provider_calls"] == 0 and payload["all_skipped"]
    assert all(len(r["steps"]) == len(STORYBOARD_STEPS) for r in payload["runs"])
    assert all(payload["images"][r["partition"]] for r in payload["runs"])
    calls = cli.ledger.provider_calls()
    assert len(calls) > 0 and {c["project_id"] for c in calls} == {"demo"}
    first_runs = {c["run_id"].split(":")[0] for c in calls}
    assert not first_runs & {r["run_id"] for r in payload["runs"]}
    # Every step of the demo is sealed by its run, the review's re-sealed after its edits:
    # the resume sensor judges none of them the long way.
    rows = cli.ledger.get_many()
    assert len(rows) == 2 * len(STORYBOARD_STEPS)
    assert sorted(str(k) for k, r in rows.items() if r.checkpoint_seal is None) == []


def test_demo_on_a_bucket_says_where_the_pictures_are_in_the_bucket(
    cli: CliEnv, s3_server: S3Server, aws_env: Callable[[S3Server], None]
) -> None:
    """With PIPELINE_STORAGE_URL the pictures are objects in the bucket; the demo
    names the bucket prefix they are under (and, with --json, each object), never the
    process's scratch folder, which is gone when the command exits."""
    aws_env(s3_server)
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/demo-home"
    stories = cli.root / "stories"
    cli.story("fox"), cli.story("ship")
    storage = {"PIPELINE_STORAGE_URL": url}
    first = cli.invoke("demo", "--stories", str(stories), env=storage)
    assert first.exit_code == 0, first.output
    assert f"images: 3 PNG under {url}/checkpoints/demo/fox/ (sketch/ 3)" in first.stdout
    assert f"images: 2 PNG under {url}/checkpoints/demo/ship/ (sketch/ 2)" in first.stdout
    assert SCRATCH_DIR not in first.stdout, first.stdout

    second = cli.invoke("demo", "--stories", str(stories), "--json", env=storage)
    assert second.exit_code == 0, second.output
    payload = json.loads(second.stdout)
    assert payload["all_skipped"] and payload["provider_calls"] == 0
    client = s3_server.client()
    for partition, count in (("demo/fox", 3), ("demo/ship", 2)):
        images = payload["images"][partition]
        assert len(images) == count, images
        assert payload["images_under"][partition] == f"{url}/checkpoints/{partition}"
        for image in images:
            assert image.startswith(f"{url}/checkpoints/{partition}/") and image.endswith(".png")
            key = image.removeprefix(f"s3://{bucket}/")
            assert client.head_object(Bucket=bucket, Key=key)["ContentLength"] > 0
