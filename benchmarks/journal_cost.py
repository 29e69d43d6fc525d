"""What the journal of paid replies adds to a run: requests and bytes, per paid reply.

Runs the sample episode's ten steps (real Dagster execution, offline models, in process)
with checkpoints on a moto S3 server, every object-store request counted by where it goes:
``journal/`` (the journal of paid replies, docs/DESIGN.md#reply-journal) or the rest (the
checkpoints, the inputs). One run holds both figures: the journal touches only its own keys,
so "the rest" is what the same run costs without it. What it saves is in the crash matrix
(``tests/e2e/test_crash_matrix.py``: a step killed after k of n replies pays n - k).

    .venv/bin/python benchmarks/journal_cost.py --rounds 3

Goal: at most one write per paid reply (one PUT each), and a LIST per step run.
"""

import argparse
import os
import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from s3_server import SECRET, running_s3_server  # noqa: E402
from storyboard_support import Env, scratch_dir, write_episode  # noqa: E402

from resources.checkpoints.journal import JOURNAL  # noqa: E402
from resources.checkpoints.published import scratch_cache_of  # noqa: E402
from resources.storage import ObjectMeta, Storage  # noqa: E402


class ByArea:
    """A storage counting its requests and bytes by area (``journal`` or ``rest``)."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner
        self.requests: Counter[tuple[str, str]] = Counter()
        self.bytes: Counter[str] = Counter()

    @staticmethod
    def _area(key: str) -> str:
        return "journal" if key == JOURNAL or key.startswith(f"{JOURNAL}/") else "rest"

    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def is_local(self) -> bool:
        return self.inner.is_local

    def get(self, key: str) -> bytes:
        self.requests[(self._area(key), "get")] += 1
        data = self.inner.get(key)
        self.bytes[self._area(key)] += len(data)
        return data

    def head(self, key: str) -> ObjectMeta | None:
        self.requests[(self._area(key), "head")] += 1
        return self.inner.head(key)

    def put_create(self, key: str, data: bytes) -> ObjectMeta:
        self.requests[(self._area(key), "put")] += 1
        self.bytes[self._area(key)] += len(data)
        return self.inner.put_create(key, data)

    def put_if_match(self, key: str, data: bytes, expected: ObjectMeta) -> ObjectMeta:
        self.requests[(self._area(key), "put")] += 1
        self.bytes[self._area(key)] += len(data)
        return self.inner.put_if_match(key, data, expected)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        self.requests[(self._area(prefix), "list")] += 1
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.requests[(self._area(key), "delete")] += 1
        self.inner.delete(key)

    def of(self, area: str) -> dict[str, int]:
        return {kind: n for (where, kind), n in sorted(self.requests.items()) if where == area}


def watched(env: Env) -> ByArea:
    cache = scratch_cache_of(env.checkpoints)
    assert cache is not None
    counter = ByArea(cache.bucket.storage)
    cache.bucket.storage = counter
    return counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="clean runs measured (default 3)")
    parser.add_argument("--smoke", action="store_true", help="a short run (CI): one round")
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    made: list[Env] = []
    with running_s3_server() as server:
        os.environ.update(server.env(SECRET))
        for round_no in range(1, args.rounds + 1):
            env = Env.sqlite(scratch_dir("bench-journal"))
            made.append(env)
            env.storage_url = f"s3://{server.new_bucket()}/sb"
            write_episode(env.home)
            counter = watched(env)
            outcome = env.materialize()
            assert outcome.result.success
            replies = outcome.total_calls
            journal, rest = counter.of("journal"), counter.of("rest")
            print(
                f"round {round_no}: {replies} paid replies; journal {journal} "
                f"{counter.bytes['journal']} bytes; the rest {rest} {counter.bytes['rest']} bytes"
            )
            print(
                f"  journal writes per paid reply: {journal.get('put', 0) / replies:.2f}; "
                f"requests added: {sum(journal.values())} of "
                f"{sum(journal.values()) + sum(rest.values())} "
                f"({sum(journal.values()) / max(1, sum(rest.values())):.2f}x the rest); bytes "
                f"added: {counter.bytes['journal'] / max(1, counter.bytes['rest']):.2f}x the rest"
            )
    for env in made:
        shutil.rmtree(env.root, ignore_errors=True)


if __name__ == "__main__":
    main()
