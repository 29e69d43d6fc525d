"""``file:///path``: a local directory, as a plain path is."""

from pathlib import Path
from urllib.parse import unquote, urlsplit

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.storage.base import Storage, mask_url
from resources.storage.local import LocalStorage


def open_url(url: str, *, home: Path) -> Storage:
    """The directory of a ``file://`` URL (local only: no host, no query)."""
    return LocalStorage(_file_path(url))


def _file_path(url: str) -> Path:
    """The directory of a ``file://`` URL: local only (no host), no query."""
    shown = mask_url(url)
    parts = urlsplit(url)
    cause = None
    if parts.netloc not in ("", "localhost"):
        cause = f"a file URL names a local directory, not one on host {parts.netloc!r}"
    elif parts.query or parts.fragment:
        cause = "a file URL takes no query or fragment"
    elif not parts.path or "\x00" in unquote(parts.path):
        cause = "a file URL needs an absolute path"
    if cause is not None:
        raise PipelineError(
            ErrorCode.STORAGE_INVALID_URL,
            f"invalid storage URL {shown}: {cause}",
            details={"url": shown, "cause": cause},
        )
    return Path(unquote(parts.path))
