"""Every benchmark runs, in the small size its ``--smoke`` option sets, and prints its figure.

A benchmark that is only run by hand rots (an import that moved, an option renamed): here
each script under benchmarks/ runs end to end in seconds, on the suite's PostgreSQL (its
databases named from a prefix of this test's own, as two people on one server would), the
moto S3 server the scripts start from tests/support and, for the fleet, the machine's
RabbitMQ and Redis (a queue of its own; about a minute). The figures are not judged (no
timed assertion holds on a loaded CI host): a run must end with status 0 and print the line
that carries its figure. A script left out is named in EXCLUDED with the reason.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from must_run import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"


@dataclass(frozen=True)
class Smoke:
    """How one benchmark runs in CI: its arguments after ``--smoke``, whether it takes the
    suite's PostgreSQL (``--pg-url``/``--db-url`` and ``--db-prefix``), the figure's line."""

    figure: str
    pg: str | None = None  # the option naming the PostgreSQL URL, if it takes one
    program: str | None = None  # a program it runs besides Python, skipped without it
    broker: bool = False  # Celery workers on the machine's RabbitMQ and Redis (--broker-url)


SMOKE: dict[str, Smoke] = {
    # The sample episode on disk and on moto S3, in process; SQLite ledgers.
    "bucket_demo.py": Smoke(r"ratio: [\d.]+x"),
    "bucket_force.py": Smoke(r"force t2i_review, resume +\d+ +\d+"),
    "journal_cost.py": Smoke(r"journal writes per paid reply: [\d.]+"),
    "resume_cost.py": Smoke(r"(PASS|FAIL)  S2: \(a\) = \(d\)"),
    # A real dagster dev (SQLite instance), the shipped sensor launching the step.
    "recovery.py": Smoke(r'"step_seconds": [\d.]+'),
    # PostgreSQL (and SQLite beside it where the script measures both).
    "claims.py": Smoke(r"\| 1 \| \d+ \| \d+ \| [\d.]+ \|", pg="--pg-url", program="pgbench"),
    "judge_overhead.py": Smoke(r"judge adds [\d.]+ ms", pg="--pg-url"),
    "object_store.py": Smoke(r"ratio +[\d.]+x", pg="--db-url"),
    "sensor_tick.py": Smoke(r"\*\*[\d.]+x\*\*", pg="--pg-url"),
    "sensor_convergence.py": Smoke(r'"converged_after_ticks": \d+', pg="--pg-url"),
    "status_scale.py": Smoke(
        r"postgresql: one partition at 200 vs 20 episodes: [\d.]+x", pg="--pg-url"
    ),
    # Celery workers (1, then 2) on the broker: a 2-episode backfill each, the same calls.
    "fleet.py": Smoke(r"\| 2 \| [\d.]+ \| [\d.]+ \| [\d.]+x \| 48 \|", pg="--pg-url", broker=True),
    # Three processes through one shared rate limit against the local limited endpoint.
    "rate_limit.py": Smoke(r"granted [\d.]+ requests/min of \d+ \([\d.]+ %", pg="--pg-url"),
}
EXCLUDED: dict[str, str] = {
    "convergence_location.py": "not a script: the code location sensor_convergence.py serves",
    "object_store_fixture.py": "not a script: the pieces of object_store.py",
    "object_store_publish.py": "not a script: the pieces of object_store.py",
    "object_store_report.py": "not a script: the pieces of object_store.py",
    "resume_cost_env.py": "not a script: the pieces of resume_cost.py",
    "resume_cost_policies.py": "not a script: the pieces of resume_cost.py",
    "resume_cost_report.py": "not a script: the pieces of resume_cost.py",
    "resume_cost_scenarios.py": "not a script: the pieces of resume_cost.py",
    "sensor_tick_fixture.py": "not a script: the pieces of sensor_tick.py",
}


def test_every_benchmark_runs_here_or_says_why_not() -> None:
    scripts = {p.name for p in BENCHMARKS.glob("*.py")}
    assert scripts == set(SMOKE) | set(EXCLUDED), "a benchmark neither smoke-run nor excluded"
    assert not set(SMOKE) & set(EXCLUDED)


def _command(script: str, smoke: Smoke, request: pytest.FixtureRequest) -> list[str]:
    command = [sys.executable, str(BENCHMARKS / script), "--smoke"]
    if smoke.pg is not None:
        server_url = str(request.getfixturevalue("pg_server_url"))
        prefix = f"smoke_{uuid.uuid4().hex[:8]}"
        command += [smoke.pg, server_url, "--db-prefix", prefix]
    if smoke.broker:
        command += ["--broker-url", str(request.getfixturevalue("celery_broker"))]
    return command


@pytest.mark.slow
@pytest.mark.parametrize(
    "script",
    [
        pytest.param(name, marks=[pytest.mark.pg] if smoke.pg else [])
        for name, smoke in sorted(SMOKE.items())
    ],
)
def test_benchmark_runs_in_its_smoke_size(
    script: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    smoke = SMOKE[script]
    if smoke.program is not None and not (
        shutil.which(smoke.program) or glob.glob(f"/usr/lib/postgresql/*/bin/{smoke.program}")
    ):
        skip_or_fail(f"{smoke.program} is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PIPELINE_"))}
    env["DAGSTER_HOME"] = str(tmp_path / "dagster_home")
    done = subprocess.run(
        _command(script, smoke, request),
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env=env,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert re.search(smoke.figure, done.stdout), done.stdout[-4000:]
