"""The real storage with its requests counted by kind: instrumentation, not a stand-in.

Every call goes to the wrapped storage (moto's S3, a directory) unchanged; a LIST counts
once per call (one page up to 1,000 keys). Used by the bucket tests and
``benchmarks/bucket_demo.py``.
"""

from collections import Counter
from collections.abc import Iterator

from storyboard_support import Env

from resources.checkpoints.published import scratch_cache_of
from resources.storage import ObjectMeta, Storage


class Counting:
    """A storage that counts its requests by kind (get, head, put, list, delete)."""

    def __init__(self, inner: Storage, counts: Counter[str]) -> None:
        self.inner = inner
        self.counts = counts

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def is_local(self) -> bool:
        return self.inner.is_local

    def get(self, key: str) -> bytes:
        self.counts["get"] += 1
        return self.inner.get(key)

    def head(self, key: str) -> ObjectMeta | None:
        self.counts["head"] += 1
        return self.inner.head(key)

    def put_create(self, key: str, data: bytes) -> ObjectMeta:
        self.counts["put"] += 1
        return self.inner.put_create(key, data)

    def put_if_match(self, key: str, data: bytes, expected: ObjectMeta) -> ObjectMeta:
        self.counts["put"] += 1
        return self.inner.put_if_match(key, data, expected)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        self.counts["list"] += 1
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.counts["delete"] += 1
        self.inner.delete(key)


def counted(env: Env, counts: Counter[str] | None = None) -> Counter[str]:
    """Count the requests of ``env``'s checkpoint store from now on (into ``counts``)."""
    counts = Counter() if counts is None else counts
    cache = scratch_cache_of(env.checkpoints)
    assert cache is not None
    inner = cache.storage.inner if isinstance(cache.storage, Counting) else cache.storage
    cache.bucket.storage = Counting(inner, counts)
    return counts
