"""Which storage a configured URL names (``PIPELINE_STORAGE_URL``, docs/DESIGN.md#storage).

The caller reads the setting and passes it in: nothing here reads the environment at
import, and only a bucket storage reads it (its credentials) when opened. Each scheme
opens through its module (the registry: :mod:`resources.storage.storage_schemes`).
"""

from pathlib import Path

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.storage.base import Storage, mask_url
from resources.storage.local import LocalStorage
from resources.storage.storage_schemes import storage_scheme, storage_schemes


def open_storage(url: str | None, *, home: Path) -> Storage:
    """The storage ``url`` names; None or empty: the local directory ``home``.

    - a plain path, or ``file:///path``: a local directory (a relative path is taken from
      the current directory);
    - ``s3://bucket[/prefix]``, ``gs://bucket[/prefix]``, ``az://container[/prefix]``: a
      bucket, configured from the environment;
    - another scheme of ``STORAGE_SCHEMES``: what its module opens;
    - anything else: ``storage.invalid_url`` (the URL shown with its secrets masked).
    """
    text = (url or "").strip()
    if not text:
        return LocalStorage(home)
    if "://" not in text:
        return LocalStorage(Path(text))
    scheme = text.split("://", 1)[0].lower()
    module = storage_scheme(scheme)
    if module is not None:
        return module.open_url(text, home=home)
    shown = mask_url(text)
    schemes = ", ".join(storage_schemes())
    cause = f"the scheme {scheme!r} is not one of {schemes} (or a plain path)"
    raise PipelineError(
        ErrorCode.STORAGE_INVALID_URL,
        f"invalid storage URL {shown}: {cause}",
        details={"url": shown, "cause": cause},
    )
