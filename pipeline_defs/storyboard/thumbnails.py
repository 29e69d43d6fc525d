"""Small pictures of the pipeline's PNGs for people to look at (the episode sheet, the
asset page's contact sheet).

Downscaled with Pillow (never by hand), re-encoded as PNG, and bounded: a thumbnail is at
most ``max_side`` pixels on its longer side, so an event or a page holding many of them
stays small whatever size the image model draws at. Where a byte budget applies (the
contact sheet, stored in Dagster's event log), ``bounded_thumbnail_png`` also shrinks a
picture that compresses badly (a photograph from a real model) until it fits.
"""

import base64
import io

from PIL import Image, UnidentifiedImageError

from pipeline_defs.resume.errors import ErrorCode, PipelineError

# 160 px on the longer side: 4-9 KB per offline-model picture (measured on the demo's 384 x
# 256 PNGs), legible in a grid of six across a laptop screen.
THUMBNAIL_SIDE = 160
# Below 48 px a picture tells a reviewer nothing: better to say it was left out.
MIN_THUMBNAIL_SIDE = 48
# Each try over a byte budget shrinks the side by this factor (about 0.64 of the bytes).
SHRINK = 0.8
# A photograph's PNG at 160 px is ~25 KB in full colour; an adaptive palette of 64 colours
# is about half that and still reads as the picture at thumbnail size.
PALETTE_COLOURS = 64


def _open(png: bytes, name: str) -> Image.Image:
    """The decoded picture in a mode Pillow resamples and quantizes (RGB, RGBA or L)."""
    try:
        with Image.open(io.BytesIO(png)) as image:
            image.load()
            if image.mode in ("RGB", "RGBA", "L"):
                return image.copy()
            return image.convert("RGBA")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise PipelineError(
            ErrorCode.CHECKPOINT_INVALID,
            f"{name} is not a readable PNG ({type(exc).__name__}: {exc})",
        ) from None


def _encode(image: Image.Image, max_side: int, *, palette: bool = False) -> bytes:
    """``image`` downscaled (never upscaled) to ``max_side``, as PNG bytes."""
    small = image.copy()
    small.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    if palette and small.mode != "L":  # a grey picture is one byte a pixel already
        small = small.quantize(PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    return out.getvalue()


def thumbnail_png(png: bytes, max_side: int = THUMBNAIL_SIDE, *, name: str = "picture") -> bytes:
    """``png`` downscaled to at most ``max_side`` px on its longer side, as PNG bytes."""
    return _encode(_open(png, name), max_side)


def bounded_thumbnail_png(
    png: bytes, max_bytes: int, max_side: int = THUMBNAIL_SIDE, *, name: str = "picture"
) -> bytes | None:
    """The largest thumbnail of ``png`` (full colour first, then a palette, side shrinking
    by ``SHRINK`` down to ``MIN_THUMBNAIL_SIDE``) whose PNG is at most ``max_bytes``; None
    when even the smallest is larger. Raises ``checkpoint.invalid`` for unreadable bytes."""
    image = _open(png, name)
    # Resample the full picture once; the smaller tries start from this copy, which is
    # cheap and, at these sizes, looks the same.
    image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    side = max_side
    while side >= MIN_THUMBNAIL_SIDE:
        for palette in (False, True):
            out = _encode(image, side, palette=palette)
            if len(out) <= max_bytes:
                return out
        side = int(side * SHRINK)
    return None


def data_uri(png: bytes) -> str:
    """A ``data:image/png;base64,…`` URI (self-contained HTML; Dagster's markdown)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
