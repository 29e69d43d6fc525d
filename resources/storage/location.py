"""Which storage a configured URL names (``PIPELINE_STORAGE_URL``, docs/DESIGN.md#storage).

The caller reads the setting and passes it in: nothing here reads the environment at
import, and only a bucket storage reads it (its credentials) when opened.
"""

from pathlib import Path
from urllib.parse import unquote, urlsplit

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.settings import BUCKET_SCHEMES
from resources.storage.base import Storage, mask_url
from resources.storage.local import LocalStorage
from resources.storage.object_store import ObjectStorage


def open_storage(url: str | None, *, home: Path) -> Storage:
    """The storage ``url`` names; None or empty: the local directory ``home``.

    - a plain path, or ``file:///path``: a local directory (a relative path is taken from
      the current directory);
    - ``s3://bucket[/prefix]``, ``gs://bucket[/prefix]``, ``az://container[/prefix]``: a
      bucket, configured from the environment;
    - anything else: ``storage.invalid_url`` (the URL shown with its secrets masked).
    """
    text = (url or "").strip()
    if not text:
        return LocalStorage(home)
    if "://" not in text:
        return LocalStorage(Path(text))
    scheme = text.split("://", 1)[0].lower()
    if scheme == "file":
        return LocalStorage(_file_path(text))
    if scheme in BUCKET_SCHEMES:
        return ObjectStorage(text)
    shown = mask_url(text)
    schemes = ", ".join(BUCKET_SCHEMES)
    cause = f"the scheme {scheme!r} is not one of file, {schemes} (or a plain path)"
    raise PipelineError(
        ErrorCode.STORAGE_INVALID_URL,
        f"invalid storage URL {shown}: {cause}",
        details={"url": shown, "cause": cause},
    )


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
