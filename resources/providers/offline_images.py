"""Deterministic offline image generator, the default (docs/DESIGN.md#reference-pipeline).

Everything runs without network, and a re-run with identical inputs yields byte-identical
PNGs, so checkpoint artifact hashes stay stable and a resume never sees spurious drift.
"""

import hashlib
import io
import math
import random
import time

from PIL import Image, ImageDraw, ImageFont
from pydantic import Field

from pipeline_defs.resume.money import Usage
from pipeline_defs.resume.settings import MAX_OFFLINE_LATENCY_MS

from .base import ImageCall, ImageModel, ImageReply, check_image_size, simulated_latency_ms

OFFLINE_IMAGE_MODEL = "offline-image-v1"

Color = tuple[int, int, int]
Font = ImageFont.ImageFont | ImageFont.FreeTypeFont


def _rng_for(call: ImageCall) -> random.Random:
    """A private RNG seeded by content so output depends on the call and nothing else."""
    digest = hashlib.sha256(f"{call.seed}\x00{call.prompt}".encode()).digest()
    return random.Random(int.from_bytes(digest, "big"))


def _color(rng: random.Random, low: int = 0, high: int = 255) -> Color:
    return (rng.randint(low, high), rng.randint(low, high), rng.randint(low, high))


def _text_width(draw: ImageDraw.ImageDraw, text: str, font: Font) -> float:
    return draw.textlength(text, font=font)


def _wrap(
    draw: ImageDraw.ImageDraw, text: str, font: Font, max_width: float, max_lines: int
) -> list[str]:
    """Greedy word wrap by measured width; overflow is ellipsized so the band never spills."""
    lines: list[str] = []
    current = ""
    for word in text.split():
        candidate = f"{current} {word}" if current else word
        if _text_width(draw, candidate, font) <= max_width:
            current = candidate
            continue
        if current:
            lines.append(current)
        current = word
        # A single word wider than the band is hard-cut character by character.
        while _text_width(draw, current, font) > max_width and len(current) > 1:
            cut = len(current) - 1
            while cut > 1 and _text_width(draw, current[:cut], font) > max_width:
                cut -= 1
            lines.append(current[:cut])
            current = current[cut:]
    if current:
        lines.append(current)
    if len(lines) > max_lines:
        lines = lines[:max_lines]
        last = lines[-1]
        while last and _text_width(draw, last + "…", font) > max_width:
            last = last[:-1]
        lines[-1] = last + "…"
    return lines


def _draw_scene(draw: ImageDraw.ImageDraw, rng: random.Random, width: int, height: int) -> None:
    """Sky, horizon, sun, a few props and a stick figure — all positions and colours seeded."""
    sky = _color(rng, 40, 230)
    draw.rectangle((0, 0, width, height), fill=sky)
    horizon = int(height * rng.uniform(0.45, 0.7))
    draw.rectangle((0, horizon, width, height), fill=_color(rng, 20, 160))
    sun_r = max(2, int(min(width, height) * rng.uniform(0.05, 0.12)))
    sx, sy = rng.randint(0, width), rng.randint(0, max(1, horizon // 2))
    draw.ellipse((sx - sun_r, sy - sun_r, sx + sun_r, sy + sun_r), fill=_color(rng, 180, 255))
    for _ in range(rng.randint(2, 5)):
        w = max(2, int(width * rng.uniform(0.06, 0.2)))
        h = max(2, int(height * rng.uniform(0.08, 0.35)))
        x = rng.randint(-w // 2, width - w // 2)
        shape_fill, outline = _color(rng), _color(rng, 0, 80)
        if rng.random() < 0.5:
            draw.rectangle((x, horizon - h, x + w, horizon), fill=shape_fill, outline=outline)
        else:
            y = rng.randint(0, max(1, horizon - h))
            draw.ellipse((x, y, x + w, y + h), fill=shape_fill, outline=outline)
    _draw_figure(draw, rng, width, height, horizon)


def _draw_figure(
    draw: ImageDraw.ImageDraw, rng: random.Random, width: int, height: int, ground: int
) -> None:
    """A stick figure standing on the ground line: the 'character' of the shot."""
    size = max(8, int(height * rng.uniform(0.25, 0.4)))
    cx = rng.randint(size // 2, max(size // 2 + 1, width - size // 2))
    feet = min(height - 1, ground + int(size * 0.1))
    head_r = max(2, size // 8)
    neck = feet - size + 2 * head_r
    hip = feet - size // 3
    line = max(1, size // 25)
    ink = _color(rng, 0, 90)
    draw.ellipse(
        (cx - head_r, neck - 2 * head_r, cx + head_r, neck), fill=_color(rng, 150, 255), outline=ink
    )
    draw.line((cx, neck, cx, hip), fill=ink, width=line)
    arm_y = neck + (hip - neck) // 3
    spread = size // 3
    draw.line(
        (cx - spread, arm_y + rng.randint(-spread, spread // 2), cx, arm_y), fill=ink, width=line
    )
    draw.line(
        (cx, arm_y, cx + spread, arm_y + rng.randint(-spread, spread // 2)), fill=ink, width=line
    )
    draw.line((cx, hip, cx - size // 5, feet), fill=ink, width=line)
    draw.line((cx, hip, cx + size // 5, feet), fill=ink, width=line)


def _draw_caption(image: Image.Image, caption: str) -> None:
    """Caption in a dark band at the bottom so a reviewer knows which shot this stands for."""
    text = " ".join(caption.split())
    if not text:
        return
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    width, height = image.size
    left, top, _, bottom = draw.textbbox((0, 0), "Ag", font=font)
    line_h = max(1, math.ceil(bottom - top)) + 2
    pad = 4
    max_lines = max(1, (height // 3 - 2 * pad) // line_h)
    lines = _wrap(draw, text, font, max(1, width - 2 * pad), max_lines)
    band_top = max(0, height - (len(lines) * line_h + 2 * pad))
    draw.rectangle((0, band_top, width, height), fill=(16, 16, 16))
    for i, line in enumerate(lines):
        draw.text(
            (pad - left, band_top + pad + i * line_h - top), line, fill=(240, 240, 240), font=font
        )


def render_png(call: ImageCall) -> bytes:
    """Draw the picture for ``call`` and encode it as a PNG with no metadata chunks."""
    check_image_size(call)
    rng = _rng_for(call)
    image = Image.new("RGB", (call.width, call.height))
    _draw_scene(ImageDraw.Draw(image), rng, call.width, call.height)
    _draw_caption(image, call.caption)
    buffer = io.BytesIO()
    # No pnginfo and fixed compression: output depends only on the pixels.
    image.save(buffer, format="PNG", optimize=False, compress_level=6)
    return buffer.getvalue()


class OfflineImageModel(ImageModel):
    """Deterministic Pillow-drawn images: no network, no wall clock, no global randomness."""

    latency_ms: int | None = Field(
        default=None,
        ge=0,
        le=MAX_OFFLINE_LATENCY_MS,  # the bound PIPELINE_OFFLINE_LATENCY_MS has in the settings
        description="Simulated latency per call; None = PIPELINE_OFFLINE_LATENCY_MS at call time",
    )

    @property
    def model_name(self) -> str:
        """Fixed model name so the ledger distinguishes offline from real calls."""
        return OFFLINE_IMAGE_MODEL

    def generate(self, call: ImageCall) -> ImageReply:
        """Render ``call`` deterministically, after the configured simulated latency."""
        png = render_png(call)
        delay = simulated_latency_ms(self.latency_ms)
        if delay > 0:
            time.sleep(delay / 1000)
        return ImageReply(png=png, units=1, model=OFFLINE_IMAGE_MODEL, usage=Usage(images=1))
