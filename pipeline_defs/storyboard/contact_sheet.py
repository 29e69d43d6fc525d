"""The contact sheet: an image step's pictures as markdown on its materialization event.

One table row per item, in the step's own order: the item id, what this run did with it
(drew, redrew, reused), its thumbnail as a ``data:image/png;base64,…`` image (Dagster's
markdown renders data images, so the asset page needs no file server) and the prompt it
was drawn from, shortened. A redrawn item shows the picture it replaced beside the new one
(the replaced PNG is archived, docs/DESIGN.md#redraw). A SKIP draws nothing and emits no
sheet: the run protocol yields no step metadata for it (docs/DESIGN.md#launch-paths).

Bounded, because Dagster keeps every event for good and the asset page loads an event
whole: each thumbnail and the whole sheet have a byte budget (the constants below). An
episode with many items gets smaller thumbnails; when even those do not all fit, what this
run changed is shown first (redrawn, drawn, failed, then reused), and a last line names the
items left out.

Pure: facts and PNG bytes in, markdown out. The image step (``images.py``) reads the files;
a current picture is passed as a loader so only the pictures that fit are read and scaled.
"""

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.storyboard.thumbnails import bounded_thumbnail_png, data_uri

# Dagster stores each materialization as one event-log row, kept for good and loaded whole
# by the asset page (for every partition listed): 256 KB keeps that page quick and the row
# far below any database's limits, whatever the episode's size.
MAX_EVENT_BYTES = 256 * 1024
# The rest of the event: about 3 KB measured (the other metadata, ids, tags), more for a
# redraw naming many dependents.
EVENT_HEADROOM_BYTES = 12 * 1024
# What the sheet may take as the event log stores it (JSON text: ``sheet_bytes``), so the
# whole event stays under MAX_EVENT_BYTES.
MAX_SHEET_BYTES = MAX_EVENT_BYTES - EVENT_HEADROOM_BYTES
# A thumbnail's PNG at most 8 KB (about 11 KB as base64): the offline model's pictures fit
# at the full thumbnail side (3-6 KB at 160 px), a photograph fits after shrinking, and at
# least twenty items fit on a sheet even when every picture is at the bound.
MAX_THUMBNAIL_BYTES = 8 * 1024
# A prompt shortened to this many characters: enough to recognise it (the whole prompt is
# in the upstream checkpoint it was built from).
PROMPT_CHARS = 160
# Kept free for the line naming what was left out; ids beyond it are counted, not named.
LEFT_OUT_RESERVE = 4 * 1024
# An episode with many items gets smaller thumbnails rather than fewer, down to this bound
# (about 80 px for a photograph, still recognisable; the offline model's drawings stay at
# 160 px); past it, items are left out instead.
MIN_SHARED_THUMBNAIL_BYTES = 4 * 1024
# What a row takes besides its pictures (id, action, shortened prompt, escapes), to share
# the budget among the pictures; an estimate, the budget itself is enforced row by row.
ROW_TEXT_BYTES = 320

# Characters that would start markdown (or end a table cell) inside a cell; CommonMark
# takes a backslash before any of them as the character itself.
_MARKDOWN_SPECIAL = frozenset("\\`*_[]<>|&~")


class ItemAction(StrEnum):
    """What this run did about one item (the words the sheet shows)."""

    DREW = "drew"
    REDREW = "redrew"
    REUSED = "reused"
    KEPT_OUTDATED = "reused, outdated"  # built from a picture redrawn since (kept as is)
    FAILED = "failed"


# Which items a sheet too small for all of them shows first: what this run changed.
_PRIORITY = {
    ItemAction.REDREW: 0,
    ItemAction.DREW: 1,
    ItemAction.FAILED: 2,
    ItemAction.KEPT_OUTDATED: 3,
    ItemAction.REUSED: 4,
}


@dataclass(frozen=True)
class SheetItem:
    """One item of the step, as the sheet shows it."""

    item_id: str
    action: ItemAction
    prompt: str
    # Reads the item's current PNG; called only if the item fits on the sheet.
    picture: Callable[[], bytes] | None = None
    # The thumbnail (``thumbnail``) of the picture a redraw replaced, made before drawing.
    replaced: bytes | None = None
    note: str = ""  # why there is no picture (a failed item's reason)


@dataclass(frozen=True)
class ContactSheet:
    markdown: str
    shown: tuple[str, ...]
    left_out: tuple[str, ...]


def thumbnail(png: bytes, *, name: str, max_bytes: int = MAX_THUMBNAIL_BYTES) -> bytes | None:
    """``png`` as a thumbnail within ``max_bytes``; None if it cannot be (unreadable, or
    too large even at the smallest side): the sheet then says so instead of failing."""
    try:
        return bounded_thumbnail_png(png, max_bytes, name=name)
    except PipelineError:
        return None


def build_contact_sheet(
    title: str,
    items: Sequence[SheetItem],
    *,
    max_bytes: int = MAX_SHEET_BYTES,
    max_thumbnail_bytes: int = MAX_THUMBNAIL_BYTES,
) -> ContactSheet:
    """The sheet's markdown, at most ``max_bytes`` (``sheet_bytes``), and which items it
    shows."""
    with_replaced = any(item.action is ItemAction.REDREW for item in items)
    head = _header(title, items, with_replaced)
    budget = max_bytes - sheet_bytes(head) - LEFT_OUT_RESERVE
    per_thumbnail = _shared_thumbnail_bytes(items, budget, max_thumbnail_bytes)
    rows: dict[int, str] = {}
    ranked = sorted(range(len(items)), key=lambda i: (_PRIORITY[items[i].action], i))
    for index in ranked:
        row = _row(items[index], with_replaced, per_thumbnail)
        if sheet_bytes(row) > budget:
            break  # items keep their rank: a later, smaller row would jump the queue
        rows[index] = row
        budget -= sheet_bytes(row)
    shown = tuple(items[i].item_id for i in sorted(rows))
    left_out = tuple(item.item_id for i, item in enumerate(items) if i not in rows)
    markdown = head + "".join(rows[i] for i in sorted(rows))
    if left_out:
        markdown += "\n" + _left_out_line(left_out, LEFT_OUT_RESERVE) + "\n"
    return ContactSheet(markdown, shown, left_out)


# ----------------------------------------------------------------------------- parts
def _shared_thumbnail_bytes(items: Sequence[SheetItem], budget: int, most: int) -> int:
    """Each thumbnail's bound: ``most``, or less when that many would not fit (base64 takes
    4 bytes per 3), never below ``MIN_SHARED_THUMBNAIL_BYTES``."""
    pictures = sum(1 for item in items if item.picture is not None)
    if pictures == 0:
        return most
    share = (budget - ROW_TEXT_BYTES * len(items)) // pictures * 3 // 4
    return max(min(most, MIN_SHARED_THUMBNAIL_BYTES), min(most, share))


def sheet_bytes(text: str) -> int:
    """``text``'s size in the event log, which stores metadata as ASCII JSON: a backslash
    or a quote takes two bytes there, a non-ASCII character (the ``…``) six."""
    return len(json.dumps(text)) - 2


def _text(value: str) -> str:
    """Plain text for one table cell: one line, markdown characters escaped."""
    flat = " ".join(value.split())
    return "".join(f"\\{c}" if c in _MARKDOWN_SPECIAL else c for c in flat)


def _shorten(value: str, limit: int = PROMPT_CHARS) -> str:
    flat = " ".join(value.split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut + "…"


def _header(title: str, items: Sequence[SheetItem], with_replaced: bool) -> str:
    counts = {action: 0 for action in ItemAction}
    for item in items:
        counts[item.action] += 1
    done = ", ".join(f"{n} {action.value}" for action, n in counts.items() if n)
    columns = ["item", "this run", *(["replaced"] if with_replaced else []), "picture"]
    columns.append("drawn from")
    return (
        f"**{_text(title)}**: {len(items)} items ({done or 'none'})\n\n"
        + "| "
        + " | ".join(columns)
        + " |\n"
        + "|"
        + "---|" * len(columns)
        + "\n"
    )


def _image(png: bytes, alt: str) -> str:
    return f"![{_text(alt)}]({data_uri(png)})"


def _row(item: SheetItem, with_replaced: bool, max_thumbnail_bytes: int) -> str:
    cells = [_text(item.item_id), item.action.value]
    if with_replaced:
        if item.replaced is not None:
            cells.append(_image(item.replaced, f"{item.item_id} before"))
        else:
            cells.append(" ")
    cells.append(_picture_cell(item, max_thumbnail_bytes))
    cells.append(_text(_shorten(item.prompt)))
    return "| " + " | ".join(cells) + " |\n"


def _picture_cell(item: SheetItem, max_thumbnail_bytes: int) -> str:
    if item.picture is None:
        return _text(item.note or "no picture")
    try:
        png = thumbnail(item.picture(), name=item.item_id, max_bytes=max_thumbnail_bytes)
    except (OSError, PipelineError) as exc:  # gone or a link since it was placed: say so
        return _text(f"no thumbnail ({exc})")
    if png is None:
        return _text("no thumbnail (unreadable, or too large to show)")
    return _image(png, item.item_id)


def _left_out_line(left_out: Sequence[str], limit: int) -> str:
    """``N more items not shown: a, b, …``, named while they fit in ``limit`` bytes."""
    head = f"{len(left_out)} more items not shown: "
    named: list[str] = []
    used = sheet_bytes(head) + 64  # room for the tail naming how many are only counted
    for item_id in left_out:
        piece = _text(item_id)
        if used + sheet_bytes(piece) + 2 > limit:
            break
        named.append(piece)
        used += sheet_bytes(piece) + 2
    rest = len(left_out) - len(named)
    tail = f" and {rest} more" if rest else ""
    return head + ", ".join(named) + tail + " (all of them: `storyboard sheet`)"
