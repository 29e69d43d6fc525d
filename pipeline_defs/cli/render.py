"""Output: aligned tables wrapped to the terminal, hints with the commands in them, JSON,
and the short forms of durations and ages the commands print."""

import json
import re
import shutil
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import click


def render_table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], width: int | None = None
) -> str:
    """A plain aligned text table; None shows as '-'.

    With ``width`` the last column (the free text: a reason, a block) is wrapped to fit it,
    never cut; when the other columns leave it too little room, it goes on indented lines
    under its row instead.
    """
    head, groups = table_lines(headers, rows, width)
    return "\n".join([*head, *(line for group in groups for line in group)])


def table_lines(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], width: int | None = None
) -> tuple[list[str], list[list[str]]]:
    """:func:`render_table` as its header lines and, per row, that row's lines."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    if width is None or not headers:
        return _aligned(headers, widths), [[_row(row, widths)] for row in cells]
    fixed = sum(w + 2 for w in widths[:-1])
    room = width - fixed
    groups: list[list[str]] = []
    if room >= MIN_TEXT_WIDTH:
        last = min(widths[-1], room)
        for row in cells:
            lines = wrap(row[-1], last) or [""]
            groups.append([_row([*row[:-1], lines[0]], [*widths[:-1], last])])
            groups[-1] += [" " * fixed + line for line in lines[1:]]
        return _aligned(headers, [*widths[:-1], last]), groups
    label = f"    {headers[-1]}: "
    for row in cells:
        groups.append([_row(row[:-1], widths[:-1])])
        if row[-1] != "-":
            wrapped = wrap(row[-1], width - len(label))
            groups[-1] += [
                (label if i == 0 else " " * len(label)) + w for i, w in enumerate(wrapped)
            ]
    return _aligned(headers[:-1], widths[:-1]), groups


MIN_TEXT_WIDTH = 30


def _aligned(headers: Sequence[str], widths: Sequence[int]) -> list[str]:
    return [_row(headers, widths), "  ".join("-" * w for w in widths)]


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """Wrapped at spaces only: a path or an id in the text stays whole (and copyable)."""
    return textwrap.wrap(
        text,
        max(MIN_TEXT_WIDTH, width),
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def terminal_width() -> int:
    """Columns of the terminal (``COLUMNS`` first); 100 when not attached to one."""
    return shutil.get_terminal_size((100, 24)).columns


# A storyboard command inside an operator hint, e.g. "... (storyboard force --partition p/e
# --step s); ..." or "If not: storyboard reset-running ... --expected-started-at 'T'", or
# the one with words of its own: "raise the cap: storyboard settings set KEY VALUE; ...".
_COMMAND = re.compile(
    r"storyboard settings set [a-z_]+ [^\s;)'\"]+"
    r"|storyboard [a-z-]+(?: --[a-z-]+(?: (?!--)(?:'[^']*'|\"[^\"]*\"|[^\s;)'\"]+))?)*"
)


def commands_in(hint: str) -> list[str]:
    """The commands a hint tells the operator to run, each whole (to print on its own line)."""
    return _COMMAND.findall(hint or "")


def advice(lines: list[str], hint: str, width: int, indent: str = "    ") -> None:
    """A hint wrapped to the terminal, then each command in it whole on its own line."""
    lines += wrap(f"next: {hint}", width - len(indent), indent)
    lines += [f"{indent}  {command}" for command in commands_in(hint)]


class SaidOnce:
    """A block said once per screen: the first step that has it shows its reason and what
    to do; every later step with the same reason and advice (a bad project file blocks
    every step of every episode of its project) points at that first one."""

    def __init__(self) -> None:
        self._first: dict[tuple[str, str], str] = {}

    def earlier(self, where: str, reason: str | None, hint: str | None) -> str | None:
        """``where`` said it first: None (say it); else the place that said it."""
        if not reason and not hint:
            return None
        key = (reason or "", hint or "")
        first = self._first.setdefault(key, where)
        return None if first == where else first


def clip(text: Any, width: int = 60) -> str | None:
    if text is None:
        return None
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def seconds(value: float | None) -> str | None:
    if value is None:
        return None
    return f"{value:.2f}s" if value < 10 else f"{value:.1f}s"


def emit_json(payload: Mapping[str, Any]) -> None:
    click.echo(json.dumps(payload, indent=2, default=str, sort_keys=False))


def listed(items: Sequence[str]) -> list[str]:
    """Items of a comma-separated list, each keeping its comma (for :func:`packed`)."""
    return [f"{item}," for item in items[:-1]] + list(items[-1:])


def packed(label: str, items: Sequence[str], width: int) -> list[str]:
    """``label`` and the items two spaces apart (one after a list's comma or colon), wrapped
    between items only: an item such as ``lease_seconds=60 (default)`` is never split."""
    lines: list[str] = []
    line = label
    for item in items:
        gap = " " if line == label or line.endswith((",", ":")) else "  "
        if line.strip() and len(line) + len(gap) + len(item) > width:
            lines.append(line)
            line, gap = "  ", ""  # continued under an indent
        line = f"{line}{gap}{item}" if line else item
    return [*lines, line]


def age(seconds: float | None) -> str:
    """A wait as operators read it: ``45s``, ``12m05s``, ``3h02m``."""
    if seconds is None:
        return "-"
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
