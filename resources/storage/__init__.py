"""One storage for checkpoints, artifacts, archives, pending edits, inputs (docs/DESIGN.md#storage).

A local directory (the default, ``PIPELINE_HOME``) or a bucket (``s3://``, ``gs://``,
``az://``), behind one contract (``Storage``): immutable objects, create-only puts,
compare-and-set replacements, typed errors that name the key and the storage.
"""

from resources.storage.base import MAX_KEY_BYTES, ObjectMeta, Storage, mask_url, validate_key
from resources.storage.bucket_location import BucketLocation, parse_bucket_url
from resources.storage.local import LocalStorage
from resources.storage.location import open_storage
from resources.storage.object_store import ObjectStorage

__all__ = [
    "MAX_KEY_BYTES",
    "BucketLocation",
    "LocalStorage",
    "ObjectMeta",
    "ObjectStorage",
    "Storage",
    "mask_url",
    "open_storage",
    "parse_bucket_url",
    "validate_key",
]
