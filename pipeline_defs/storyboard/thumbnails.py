"""Small pictures of the pipeline's PNGs for people to look at (the episode sheet, the
asset page's contact sheet).

Downscaled with Pillow (never by hand), re-encoded as PNG, and bounded: a thumbnail is at
most ``max_side`` pixels on its longer side, so an event or a page holding many of them
stays small whatever size the image model draws at.
"""

import base64
import io

from PIL import Image, UnidentifiedImageError

from pipeline_defs.resume.errors import PipelineError

# 160 px on the longer side: 4-9 KB per offline-model picture (measured on the demo's 384 x
# 256 PNGs), legible in a grid of six across a laptop screen.
THUMBNAIL_SIDE = 160


def thumbnail_png(png: bytes, max_side: int = THUMBNAIL_SIDE, *, name: str = "picture") -> bytes:
    """``png`` downscaled to at most ``max_side`` px on its longer side, as PNG bytes."""
    try:
        with Image.open(io.BytesIO(png)) as image:
            image.load()
            small = image.convert("RGBA") if image.mode not in ("RGB", "RGBA", "L") else image
            small = small.copy()
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise PipelineError(
            "checkpoint.invalid", f"{name} is not a readable PNG ({type(exc).__name__}: {exc})"
        ) from None
    small.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    small.save(out, format="PNG", optimize=True)
    return out.getvalue()


def data_uri(png: bytes) -> str:
    """A ``data:image/png;base64,…`` URI (self-contained HTML; Dagster's markdown)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
