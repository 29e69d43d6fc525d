"""Offline image provider: deterministic, valid PNGs that differ when their inputs differ."""

import dataclasses
import hashlib
import io
import os
import random
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from pipeline_defs.resume.errors import PipelineError
from resources.providers import (
    OFFLINE_IMAGE_MODEL,
    PNG_SIGNATURE,
    ImageCall,
    ImageModel,
    OfflineImageModel,
)

REPO = Path(__file__).resolve().parents[2]
CALL = ImageCall(
    prompt="Wide shot: Ann stands on the cliff at dawn, wind in her coat",
    caption="S1_L0_V0 — Ann on the cliff at dawn, looking out over the stormy sea",
    width=320,
    height=192,
    seed="3f9a1c",
)


def png_chunk_types(png: bytes) -> list[bytes]:
    assert png.startswith(PNG_SIGNATURE)
    pos, kinds = len(PNG_SIGNATURE), []
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kinds.append(png[pos + 4 : pos + 8])
        pos += 12 + length
    return kinds


def test_same_call_gives_identical_bytes() -> None:
    first = OfflineImageModel().generate(CALL)
    second = OfflineImageModel().generate(dataclasses.replace(CALL))

    assert first.png == second.png
    assert first.units == 1
    assert first.model == OFFLINE_IMAGE_MODEL
    assert OfflineImageModel().model_name == OFFLINE_IMAGE_MODEL
    assert isinstance(OfflineImageModel(), ImageModel)


@pytest.mark.parametrize(
    "change",
    [{"seed": "3f9a1d"}, {"caption": "S1_L0_V1 — a different shot"}, {"prompt": "Close-up"}],
    ids=["seed", "caption", "prompt"],
)
def test_different_inputs_give_different_bytes(change: dict[str, Any]) -> None:
    model = OfflineImageModel()
    assert model.generate(CALL).png != model.generate(dataclasses.replace(CALL, **change)).png


def test_different_seed_changes_the_picture_not_only_the_caption() -> None:
    model = OfflineImageModel()
    a = Image.open(io.BytesIO(model.generate(dataclasses.replace(CALL, caption="")).png))
    b = Image.open(
        io.BytesIO(model.generate(dataclasses.replace(CALL, caption="", seed="other")).png)
    )
    assert a.tobytes() != b.tobytes()


@pytest.mark.parametrize(("width", "height"), [(320, 192), (64, 64), (1, 1), (17, 900)])
def test_valid_png_of_requested_size(width: int, height: int) -> None:
    png = OfflineImageModel().generate(dataclasses.replace(CALL, width=width, height=height)).png

    image = Image.open(io.BytesIO(png))
    image.verify()
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG"
    assert image.size == (width, height)
    assert image.mode == "RGB"
    # No text/time chunks: bytes depend on pixels only.
    assert set(png_chunk_types(png)) <= {b"IHDR", b"IDAT", b"IEND"}


def test_long_and_empty_captions_render() -> None:
    model = OfflineImageModel()
    long_caption = " ".join(["storyboard"] * 200) + " " + "x" * 300
    for caption in ("", "   ", long_caption):
        png = model.generate(dataclasses.replace(CALL, caption=caption)).png
        assert Image.open(io.BytesIO(png)).size == (CALL.width, CALL.height)


@pytest.mark.parametrize(("width", "height"), [(0, 10), (10, -1), (5000, 10)])
def test_invalid_size_is_typed_error(width: int, height: int) -> None:
    with pytest.raises(PipelineError) as info:
        OfflineImageModel().generate(dataclasses.replace(CALL, width=width, height=height))
    assert info.value.code == "input.invalid"


def test_global_random_state_untouched() -> None:
    random.seed(1234)
    before = random.getstate()
    OfflineImageModel().generate(CALL)
    assert random.getstate() == before


def test_latency_is_simulated() -> None:
    started = time.monotonic()
    OfflineImageModel(latency_ms=60).generate(CALL)
    assert time.monotonic() - started >= 0.06


def test_bytes_identical_across_processes() -> None:
    """No dependence on PYTHONHASHSEED or process state: a fresh interpreter agrees."""
    script = (
        "import hashlib; from resources.providers import ImageCall, OfflineImageModel; "
        f"c = ImageCall(**{CALL.__dict__!r}); "
        "print(hashlib.sha256(OfflineImageModel().generate(c).png).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == hashlib.sha256(OfflineImageModel().generate(CALL).png).hexdigest()
