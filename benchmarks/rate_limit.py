"""How much of a shared rate limit N processes are granted, and how many 429s they meet.

``--processes`` processes (default 3) call one endpoint's model as fast as they may, each
through the HTTP text provider (``resources/providers/openai_http.py``) and the shared rate
limit of the ledger they share (``pipeline_defs/steps/rate_wait.py`` ``LedgerThrottle``,
docs/DESIGN.md#rate-limit), all set to ``requests_per_minute: --limit``. The endpoint is
tests/support/openai_server.py's local server enforcing the same limit as a real one counts
it (``SlidingLimit``: at most ``--limit`` requests in any sliding minute, a 429 with
``Retry-After`` beyond it; ``--window`` shortens that minute, the count scaled with it).

The figure is the requests the server admitted in the ``--seconds`` after every process is
ready, per minute, against the limit (goal: at least 90 %; the limit spaces its grants 2 %
wider than ``60 / limit`` seconds, so about 98 % is the most), and the 429s the server
answered (goal: none, or one at a window's edge on a loaded host).

    .venv/bin/python benchmarks/rate_limit.py --processes 3 --limit 60 --seconds 180 \\
        --pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test

Without ``--pg-url`` (or ``PIPELINE_BENCH_PG_URL`` / ``PIPELINE_TEST_PG_URL``) the processes
share a SQLite ledger (one machine). A PostgreSQL run creates its own database named
``<--db-prefix>_<random>`` (dropped afterwards unless ``--keep``).
"""

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow `python benchmarks/rate_limit.py` from anywhere
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from openai_server import CHAT, Reply, SlidingLimit, chat_body, serving  # noqa: E402

from pipeline_defs.resume.partition import StepKey  # noqa: E402
from pipeline_defs.steps.rate_wait import LedgerThrottle  # noqa: E402
from resources.ledger.gcra import Limits  # noqa: E402
from resources.ledger.store import LedgerStore, engine_for  # noqa: E402
from resources.providers.base import TextCall  # noqa: E402
from resources.providers.openai_http import OpenAITextModel  # noqa: E402
from resources.providers.throttle import throttled  # noqa: E402

KEY_ENV = "SB_RATE_BENCH_KEY"
MODEL = "bench-rate-text"
# Seconds the processes are given to start and import before the run is given up.
START_TIMEOUT = 300.0


@dataclass(frozen=True)
class WorkerResult:
    """What one process did: requests answered 200, 429s its throttle was told of, seconds
    it slept for the limit, and the error that stopped it (None: it ran to the end)."""

    worker: int
    answered: int
    limited: int
    waited: float
    error: str | None = None


def worker(
    number: int,
    db_url: str,
    base_url: str,
    limit: int,
    seconds: float,
    ready: Any,
    results: Any,
) -> None:
    """One process: calls the model through the shared limit for ``seconds`` after every
    process is ready."""
    os.environ[KEY_ENV] = "sk-rate-bench"
    ledger = LedgerStore(db_url)
    key = StepKey("bench", f"w{number}", "scene_detail")
    throttle = LedgerThrottle(ledger.rate_limits, key, f"bench-{number}:0", Limits(limit))
    model = OpenAITextModel(
        base_url=base_url, model=MODEL, api_key_env=KEY_ENV, timeout_seconds=30, max_retries=8
    )
    call = TextCall("scene_detail", "Describe the scene.", {"scene": number})
    answered, error = 0, None
    # Warm: the SDK imported, its client made and the ledger's engine connected before the
    # clock starts (a process's first call otherwise spends a second on them).
    model._client()
    ledger.rate_limits.paused_for(base_url, MODEL)
    ready.wait(timeout=START_TIMEOUT)
    deadline = time.monotonic() + seconds
    try:
        with throttled(throttle):
            while time.monotonic() < deadline:
                model.complete(call)
                answered += 1
    except Exception as exc:  # reported by the parent, which fails the run
        error = f"{type(exc).__name__}: {exc}"
    results.put(WorkerResult(number, answered, throttle.limited, throttle.waited, error))


@contextmanager
def ledger_url(args: argparse.Namespace, scratch: Path) -> Iterator[str]:
    """A fresh, migrated ledger every process shares; its URL."""
    if not args.pg_url:
        url = f"sqlite:///{scratch / 'ledger.sqlite3'}"
        LedgerStore(url).migrate()
        yield url
        return
    name = f"{args.db_prefix}_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(args.pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = sa.make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
    try:
        LedgerStore(url).migrate()
        yield url
    finally:
        engine_for(url).dispose()
        if args.keep:
            print(f"kept database {name}")
        else:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def run(args: argparse.Namespace) -> int:
    ledger = "postgresql" if args.pg_url else "sqlite"
    per_window = max(1, round(args.limit * args.window / 60))
    print(
        f"{args.processes} processes, requests_per_minute {args.limit}, {args.seconds:g} s, "
        f"{ledger} ledger; the server admits {per_window} in any {args.window:g} s",
        flush=True,
    )
    spawn = multiprocessing.get_context("spawn")
    with (
        tempfile.TemporaryDirectory(prefix="rate-limit-") as tmp,
        ledger_url(args, Path(tmp)) as url,
        serving() as server,
    ):
        server.script(CHAT, Reply(body=chat_body('{"scene": "ok"}', model=MODEL)))
        server.limit = SlidingLimit(per_window=per_window, window=args.window)
        ready = spawn.Barrier(args.processes + 1)
        results = spawn.Queue()
        processes = [
            spawn.Process(
                target=worker,
                args=(n, url, server.base_url, args.limit, args.seconds, ready, results),
            )
            for n in range(args.processes)
        ]
        for process in processes:
            process.start()
        ready.wait(timeout=START_TIMEOUT)
        started = time.monotonic()
        done = [results.get(timeout=START_TIMEOUT + args.seconds + 120) for _ in processes]
        for process in processes:
            process.join(timeout=60)
        ended = started + args.seconds
        admitted = [t for t in server.limit.times if started <= t < ended]
        refused = server.limit.refused
    granted = len(admitted) * 60 / args.seconds
    share = granted / args.limit * 100
    for result in sorted(done, key=lambda r: r.worker):
        print(
            f"  process {result.worker}: {result.answered} answered, {result.limited} x 429, "
            f"waited {result.waited:.1f} s for the limit"
            + (f"; stopped: {result.error}" if result.error else ""),
            flush=True,
        )
    print(
        f"granted {granted:.1f} requests/min of {args.limit} ({share:.1f} %, goal >= 90 %), "
        f"{refused} x 429, {args.processes} processes, {args.seconds:g} s, {ledger}",
        flush=True,
    )
    failed = [r for r in done if r.error]
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=3, help="processes sharing the limit (3)")
    parser.add_argument(
        "--limit",
        type=int,
        default=60,
        help="provider.requests_per_minute, also the server's limit (60)",
    )
    parser.add_argument(
        "--seconds", type=float, default=180.0, help="how long the processes call (180)"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=60.0,
        help="the server's sliding window in seconds, admitting limit x window / 60 in any "
        "window (60: a real endpoint's minute)",
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("PIPELINE_BENCH_PG_URL") or os.environ.get("PIPELINE_TEST_PG_URL"),
        help="a PostgreSQL server database we may CREATE DATABASE from (default: "
        "PIPELINE_BENCH_PG_URL, else PIPELINE_TEST_PG_URL; none: a SQLite ledger)",
    )
    parser.add_argument(
        "--db-prefix", default="bench_rate", help="name prefix of the database it creates"
    )
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL database")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a size that runs in seconds (CI): 600 a minute for 10 s, the server's window 10 s",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.limit, args.seconds, args.window = 600, 10.0, 10.0
    if args.processes < 1 or args.limit < 1 or args.seconds <= 0 or args.window <= 0:
        parser.error("--processes, --limit, --seconds and --window must be positive")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
