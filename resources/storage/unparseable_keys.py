"""Keys obstore cannot parse (``..`` or ``.`` parts, an empty part, a control character):
which key an error names, and where a listing may resume past it.

Such a key, planted by another tool, is foreign to the pipeline; obstore fails a whole LIST
page on it, so :class:`~resources.storage.object_store.ObjectStorage` skips it with these.
"""

import re

# The bad key of an InvalidPathError (its debug part, Rust-escaped).
_BAD_PATH = re.compile(r'path: "((?:[^"\\]|\\.)*)"')
_RUST_ESCAPE = re.compile(r"\\(u\{([0-9a-fA-F]+)\}|.)")
_CONTROL_CHAR = re.compile(r"[\x00-\x1f\x7f]")


def bad_key(exc: BaseException) -> str | None:
    """The key obstore refused to parse, unescaped from its error's debug text."""
    found = _BAD_PATH.search(str(exc))
    if found is None:
        return None

    def unescape(match: "re.Match[str]") -> str:
        if match.group(2) is not None:
            return chr(int(match.group(2), 16))
        char = match.group(1)
        return {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}.get(char, char)

    return _RUST_ESCAPE.sub(unescape, found.group(1))


def _parses(key: str) -> bool:
    """Whether obstore parses ``key`` as a path (its rules, not our stricter key rules)."""
    return bool(key) and not any(
        part in ("", ".", "..") or _CONTROL_CHAR.search(part) for part in key.split("/")
    )


def poisoned(head: str) -> bool:
    """Whether every key starting with ``head`` is unparseable: a control character, or
    a complete part (one a '/' ends) that is empty, ``.`` or ``..``."""
    if _CONTROL_CHAR.search(head):
        return True
    return any(part in ("", ".", "..") for part in head.split("/")[:-1])


def resume_after(bad: str) -> str | None:
    """A parseable key to list after that skips ``bad`` and, of the keys just after it,
    only unparseable ones (the key returned itself is probed apart): None if none."""
    for end in range(1, len(bad) + 1):
        if poisoned(bad[:end]):
            code = ord(bad[end - 1]) + 1
            while _CONTROL_CHAR.match(chr(code)):
                code += 1
            candidate = bad[: end - 1] + chr(code)
            break
    else:
        candidate = bad + " "  # bad + a control character is all that sorts between
    return candidate if _parses(candidate) and candidate > bad else None
