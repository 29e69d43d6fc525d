"""A force, then a resume, on a local disk and on a bucket: provider calls and time, side by side.

Every command is its own ``storyboard`` process, as an operator runs them (a bucket's new
process starts with an empty scratch copy). Per backend: the sample episode registered and
run, then for each forced step ``storyboard force`` and a ``storyboard materialize`` of the
partition; the calls the two paid and their wall time. The bucket is moto's S3 server on
127.0.0.1, in this process.

    .venv/bin/python benchmarks/bucket_force.py [--steps t2i_review,world_guide]

The call counts are the figures (they must be equal); absolute times differ between
machines, the bucket/disk ratio of each row is printed beside them.
"""

import argparse
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from s3_server import SECRET, running_s3_server  # noqa: E402

from pipeline_defs.storyboard import sample_stories  # noqa: E402
from resources.ledger.store import LedgerStore  # noqa: E402

PARTITION = "demo/ep01"


def storyboard(root: Path, storage_url: str | None, *args: str) -> None:
    env = {
        **os.environ,
        "PIPELINE_HOME": str(root / "home"),
        "DAGSTER_HOME": str(root / "dagster_home"),
        "PIPELINE_DB_URL": f"sqlite:///{root / 'ledger.sqlite3'}",
    }
    env.pop("STORYBOARD_DEFS", None)
    env.pop("PIPELINE_STORAGE_URL", None)
    if storage_url is not None:
        env["PIPELINE_STORAGE_URL"] = storage_url
    script = str(Path(sys.executable).with_name("storyboard"))
    done = subprocess.run(
        [script, *args], env=env, capture_output=True, text=True, cwd=root, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"storyboard {' '.join(args)} failed:\n{done.stdout}{done.stderr}")


def measure(storage_url: str | None, steps: list[str]) -> list[tuple[str, int, float]]:
    root = Path(tempfile.mkdtemp(prefix="bench-force-"))
    try:
        (root / "home").mkdir()
        (root / "dagster_home").mkdir()
        ledger = LedgerStore(f"sqlite:///{root / 'ledger.sqlite3'}")
        story = str(sample_stories()["ep01"])
        storyboard(root, storage_url, "add-episode", "--project", "demo", "--episode", "ep01",
                   "--story", story)  # fmt: skip
        started = time.perf_counter()
        storyboard(root, storage_url, "materialize", "--partition", PARTITION)
        rows = [("(first run)", len(ledger.provider_calls()), time.perf_counter() - started)]
        for step in steps:
            before = len(ledger.provider_calls())
            started = time.perf_counter()
            storyboard(root, storage_url, "force", "--partition", PARTITION, "--step", step)
            storyboard(root, storage_url, "materialize", "--partition", PARTITION)
            paid = len(ledger.provider_calls()) - before
            rows.append((f"force {step}, resume", paid, time.perf_counter() - started))
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps",
        default="t2i_review,world_guide",
        help="steps forced one after another, comma separated (default t2i_review,world_guide)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="a short run (CI): one forced step, t2i_review"
    )
    args = parser.parse_args()
    if args.smoke:
        args.steps = "t2i_review"
    steps = [s for s in args.steps.split(",") if s]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log, one line a request
    disk = measure(None, steps)
    with running_s3_server() as server:
        for name, value in server.env(SECRET).items():
            os.environ[name] = value
        bucket = measure(f"s3://{server.new_bucket()}/storyboard", steps)
    print(
        f"{'what':<32} {'disk calls':>10} {'S3 calls':>9} {'disk s':>8} {'S3 s':>8} {'S3/disk':>8}"
    )
    for (what, d_calls, d_time), (_, b_calls, b_time) in zip(disk, bucket, strict=True):
        flag = "" if d_calls == b_calls else "  <- calls differ"
        print(
            f"{what:<32} {d_calls:>10} {b_calls:>9} {d_time:>8.1f} {b_time:>8.1f} "
            f"{b_time / d_time:>7.2f}x{flag}"
        )


if __name__ == "__main__":
    main()
