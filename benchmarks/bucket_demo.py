"""The storyboard episode on object storage against the same episode on a local disk.

Each round runs the sample episode's ten steps through real Dagster execution (offline
models, in process) twice, alternating: once with checkpoints under ``PIPELINE_HOME`` and
once published to a moto S3 server on 127.0.0.1 (``PIPELINE_STORAGE_URL``), the ledger on
the same database kind. It reports the median of each and their ratio, then counts the
object-store requests of what follows a run on the bucket:

- a resume on the same machine (every step SKIPs),
- a resume on a fresh machine (empty home: it fetches and verifies what it reads),
- the sensor's judgement of the episode, first on a fresh machine, then again unchanged.

    .venv/bin/python benchmarks/bucket_demo.py --rounds 5

Absolute times differ between machines; the ratio and the request counts are the figures.
"""

import argparse
import os
import shutil
import statistics
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from counting_storage import counted  # noqa: E402
from s3_server import SECRET, running_s3_server  # noqa: E402
from storyboard_support import PARTITION, Env, scratch_dir, write_episode  # noqa: E402

from pipeline_defs.judging.evaluation import evaluate_partitions  # noqa: E402
from pipeline_defs.storyboard import STORYBOARD_STEPS  # noqa: E402


def timed_run(env: Env) -> float:
    started = time.perf_counter()
    outcome = env.materialize()
    assert outcome.result.success
    return time.perf_counter() - started


def fresh(url: str | None, inputs: bool = True) -> Env:
    root = scratch_dir("bench-bucket")
    env = Env.sqlite(root)
    env.storage_url = url
    if inputs:
        write_episode(env.home)
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rounds", type=int, default=5, help="alternating disk/bucket runs timed (default 5)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a run of seconds (CI): one round, and no second judgement past the cache age",
    )
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 1
    disk: list[float] = []
    bucket: list[float] = []
    made: list[Env] = []
    with running_s3_server() as server:
        os.environ.update(server.env(SECRET))
        for _ in range(args.rounds):
            local = fresh(None)
            made.append(local)
            disk.append(timed_run(local))
            remote = fresh(f"s3://{server.new_bucket()}/sb")
            made.append(remote)
            bucket.append(timed_run(remote))
        print(f"rounds: {args.rounds}, median of each, alternating")
        print(f"  ten steps on disk:      {statistics.median(disk) * 1000:8.0f} ms")
        print(f"  ten steps on S3 (moto): {statistics.median(bucket) * 1000:8.0f} ms")
        print(f"  ratio: {statistics.median(bucket) / statistics.median(disk):.2f}x")

        url = remote.storage_url
        remote.checkpoints.publish_inputs("demo", "ep01")  # what add-episode does
        counts: Counter[str] = Counter()
        counted(remote, counts)
        remote.materialize()
        print(f"requests, resume on the same machine (all SKIP): {dict(counts)}")
        other = fresh(url, inputs=False)
        other.db_url = remote.db_url  # an empty home on the same ledger and bucket
        counted(other, counts := Counter())
        other.materialize()
        print(f"requests, resume on a fresh machine: {dict(counts)}")
        sensor = fresh(url, inputs=False)
        sensor.db_url = remote.db_url
        counted(sensor, counts := Counter())
        evaluate_partitions(STORYBOARD_STEPS, sensor.pipeline, [PARTITION], datetime.now(UTC))
        print(f"requests, the sensor's judgement on a fresh machine: {dict(counts)}")
        if not args.smoke:
            counts.clear()
            time.sleep(5.1)  # past the inputs' cache age: what a later tick pays
            evaluate_partitions(STORYBOARD_STEPS, sensor.pipeline, [PARTITION], datetime.now(UTC))
            print(f"requests, the same judgement again, nothing changed: {dict(counts)}")
    for env in made:
        shutil.rmtree(env.root, ignore_errors=True)


if __name__ == "__main__":
    main()
