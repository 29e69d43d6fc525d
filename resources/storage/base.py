"""The storage contract: immutable objects under '/'-separated keys (docs/DESIGN.md#storage).

Checkpoints, artifacts, archives, pending edits and inputs live in one storage: a local
directory (the default, today's layout under ``PIPELINE_HOME``) or a bucket. Both backends
honour the same contract, so every rule of the resume protocol holds on either:

- a put is *create-only* (``put_create``): a second writer of the same key gets
  ``storage.object_exists`` and the first writer's bytes stay, so a fenced worker can never
  replace the winner's files;
- a replacement is a *compare-and-set* (``put_if_match``) on the version the caller read,
  else ``storage.precondition_failed`` and the bytes are unchanged;
- keys are validated before any I/O (``storage.invalid_key``), so a key can never name
  something outside the storage root;
- every error is a typed ``PipelineError`` naming the key, the storage (as ``url``, secrets
  masked) and the root cause.

Pure types and helpers only: no I/O, no environment reads.
"""

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pipeline_defs.resume.errors import ErrorCode, PipelineError

# Written beside the target by the local backend while a put is in flight; never a key (a
# leftover of a killed writer is not an object, and ``list`` skips it).
TEMP_PREFIX = ".storage-tmp-"
# S3's limit, the smallest of the three clouds'.
MAX_KEY_BYTES = 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MASK = "***"


@dataclass(frozen=True)
class ObjectMeta:
    """What a storage knows of one object: enough to name it in a manifest and to CAS it.

    ``key`` is relative to the storage root. ``e_tag`` identifies the bytes as the backend
    sees them (local: mtime, size and inode; bucket: the server's ETag); ``version`` is the
    bucket's object version when versioning is on, else None. ``last_modified`` is None
    when the backend did not report it (a bucket's put answers without it).
    """

    key: str
    size: int
    e_tag: str | None
    version: str | None
    last_modified: datetime | None


@runtime_checkable
class Storage(Protocol):
    """One storage root: a local directory or a bucket with an optional prefix."""

    @property
    def url(self) -> str:
        """The storage as an operator would name it, secrets masked (for messages)."""
        ...

    @property
    def is_local(self) -> bool:
        """True for a directory on this machine (files can be opened in place)."""
        ...

    def get(self, key: str) -> bytes:
        """The object's bytes; ``storage.object_missing`` if there is none."""
        ...

    def head(self, key: str) -> ObjectMeta | None:
        """The object's metadata, or None if there is no object under ``key``."""
        ...

    def put_create(self, key: str, data: bytes) -> ObjectMeta:
        """Store ``data`` under a new ``key``; ``storage.object_exists`` if one is there."""
        ...

    def put_if_match(self, key: str, data: bytes, expected: ObjectMeta) -> ObjectMeta:
        """Replace the object if it is still ``expected`` (e_tag/version), else
        ``storage.precondition_failed`` and the stored bytes are unchanged."""
        ...

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Every object below ``prefix`` (recursive), keys relative to the root.

        ``prefix`` is matched per path segment: ``a`` lists ``a/x`` and ``a/b/y``, never
        ``ab/z`` nor ``a`` itself. Order is unspecified.
        """
        ...

    def delete(self, key: str) -> None:
        """Remove the object (garbage collection only); a missing object is not an error."""
        ...


def validate_key(key: object, *, storage: str, what: str = "key") -> tuple[str, ...]:
    """The parts of a valid key, or ``storage.invalid_key`` before any I/O.

    A key is a relative '/'-separated path: no empty part (no leading, trailing or double
    slash), no ``.`` / ``..`` part, no control character (NUL included), no part that looks
    like a temp file of the local backend, at most ``MAX_KEY_BYTES`` bytes of UTF-8. So a key
    can never climb out of the root nor mean different objects on different backends.
    """
    problem = _key_problem(key)
    if problem is not None:
        shown = repr(key) if not isinstance(key, str) else repr(key[:200])
        raise PipelineError(
            ErrorCode.STORAGE_INVALID_KEY,
            f"invalid storage {what} {shown} for storage {storage}: {problem}; "
            "nothing was read or written",
            details={"key": str(key)[:200], "storage": storage, "cause": problem},
        )
    assert isinstance(key, str)
    return tuple(key.split("/"))


def _key_problem(key: object) -> str | None:
    if not isinstance(key, str):
        return f"a key is text, not {type(key).__name__}"
    if not key:
        return "the key is empty"
    if _CONTROL.search(key):
        return "the key contains a control character (NUL, newline, ...)"
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return "the key is not valid Unicode text"
    if size > MAX_KEY_BYTES:
        return f"the key is {size} bytes long, more than {MAX_KEY_BYTES}"
    if key.startswith("/"):
        return "the key is absolute (starts with '/')"
    for part in key.split("/"):
        if not part:
            return "the key has an empty part (a leading, trailing or double '/')"
        if part in (".", ".."):
            return f"the key has a {part!r} part"
        if part.startswith(TEMP_PREFIX):
            return f"a key part may not start with {TEMP_PREFIX!r} (reserved for temp files)"
    return None


def mask_url(url: str) -> str:
    """``url`` with a password in its user part and every query value masked.

    For showing a URL someone configured (it may carry a key or a SAS token), in messages
    and as ``Storage.url``. A plain path is returned as it is.
    """
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:
        return f"{url.split('://', 1)[0]}://{MASK}"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{MASK}@{host}" if ":" in userinfo else f"{MASK}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(name, MASK) for name, _ in pairs], safe="*") if pairs else MASK
    return urlunsplit((parts.scheme, netloc, parts.path, query, MASK if parts.fragment else ""))


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret value replaced by ``MASK``.

    A backend's error text is not ours to trust: whatever it says, the credential values
    the process holds are cut out before the text reaches a message.
    """
    for secret in sorted(set(secrets), key=len, reverse=True):
        if len(secret) >= 4:  # a 1-3 character value would mask innocent text everywhere
            text = text.replace(secret, MASK)
    return text


def short_cause(exc: BaseException, limit: int = 500) -> str:
    """``Type: text`` of a backend exception, on one line, without its debug dump."""
    text = str(exc).split("\n\nDebug source:", 1)[0]
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return f"{type(exc).__name__}: {flat}" if flat else type(exc).__name__


def error_details(storage: str, key: str | None, cause: str | None) -> Mapping[str, Any]:
    """The ``details`` of a storage error: what a caller or a JSON view may pick apart."""
    out: dict[str, Any] = {"storage": storage}
    if key is not None:
        out["key"] = key
    if cause is not None:
        out["cause"] = cause
    return out


def object_missing(storage: str, key: str, cause: str) -> PipelineError:
    """``storage.object_missing``: nothing under ``key``."""
    return PipelineError(
        ErrorCode.STORAGE_OBJECT_MISSING,
        f"no object {key!r} in storage {storage} ({cause})",
        details=error_details(storage, key, cause),
    )


def object_exists(storage: str, key: str, cause: str) -> PipelineError:
    """``storage.object_exists``: a create-only put found an object under ``key``."""
    return PipelineError(
        ErrorCode.STORAGE_OBJECT_EXISTS,
        f"object {key!r} already exists in storage {storage} ({cause}): it was left as it is",
        details=error_details(storage, key, cause),
    )


def not_the_version(
    storage: str, key: str, cause: str, versions: Mapping[str, Any]
) -> PipelineError:
    """``storage.precondition_failed``: a conditional put found another version under
    ``key``; ``versions`` (expected and current e-tags, …) join the details."""
    return PipelineError(
        ErrorCode.STORAGE_PRECONDITION_FAILED,
        f"object {key!r} in storage {storage} is not the version expected ({cause}): "
        "nothing was written",
        details={**error_details(storage, key, cause), **versions},
    )
