"""``gs://bucket[/prefix]``: a Google Cloud Storage bucket, on obstore.

Its client is configured from the environment when opened
(:mod:`resources.storage.object_store`, :mod:`resources.storage.bucket_location`).
"""

from pathlib import Path

from resources.storage.base import Storage
from resources.storage.object_store import ObjectStorage


def open_url(url: str, *, home: Path) -> Storage:
    """The bucket storage ``url`` names (``home`` is scratch, not used here)."""
    return ObjectStorage(url)
