"""The fleet recipe of docs/OPERATING.md ("A fleet of workers") runs as written.

The ```bash block that opens with ``# fleet-recipe:`` is taken from the document as it stands
and run with bash from the checkout, against the machine's RabbitMQ, Redis and PostgreSQL and
a moto server this test starts. Nothing of its text is edited: what differs on this machine
goes in through the variables the script documents at its top (the PostgreSQL server, the two
databases, the queue, the bucket, the S3 endpoint and its credentials, the directory it works
in), each of them new for this test. The bucket and the databases do not exist before: the
script creates them.

The first run registers the episode and completes its ten steps on the two workers it starts;
the second run (the script is run again as it is) pays no provider call. After each, every
process the script started is gone: the workers it names in its status were stopped.
"""

import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from cli_helpers import ROOT
from dagster_dev import drop_database
from fleet_support import BACKEND_URL, delete_queue
from process_sessions import kill_session, wait_session_gone
from s3_server import ACCESS_KEY_ID, REGION, SECRET, S3Server

from pipeline_defs.resume.partition import Episode
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.storyboard import STORYBOARD_STEPS
from resources.ledger.store import engine_for
from resources.pipeline import ledger_for

pytestmark = [pytest.mark.pg, pytest.mark.xdist_group("fleet")]

DOC = ROOT / "docs" / "OPERATING.md"
MARKER = "# fleet-recipe:"
EPISODE = Episode.parse("demo/ep01")  # the one the recipe registers
SCRIPT_TIMEOUT = 600.0
# The workers the script names in its status: ``storyboard-<pid>@<host>``.
WORKER = re.compile(r"\bstoryboard-(\d+)@")


def recipe() -> str:
    """The fleet recipe's ```bash block, as written."""
    blocks: list[str] = re.findall(
        r"^```bash\n(.*?)^```$", DOC.read_text(), re.MULTILINE | re.DOTALL
    )
    found = [b for b in blocks if b.startswith(MARKER)]
    assert len(found) == 1, f"{DOC}: {len(found)} ```bash blocks open with {MARKER!r}"
    return found[0]


def documented_variables(script: str) -> set[str]:
    """The variables the script documents: ``: "${NAME:=default}"`` at its top."""
    return set(re.findall(r'"\$\{([A-Z_]+):=', script))


def _server(url: str) -> str:
    """``user[:password]@host:port`` of a PostgreSQL URL."""
    parsed = sa.make_url(url)
    secret = f":{parsed.password}" if parsed.password else ""
    return f"{parsed.username}{secret}@{parsed.host}:{parsed.port or 5432}"


@pytest.fixture
def machine(
    tmp_path: Path, pg_server_url: str, celery_broker: str, s3_server: S3Server
) -> Iterator[dict[str, str]]:
    """The recipe's variables for this machine (new databases, queue and bucket), and the
    rest of the environment without any pipeline, Dagster or AWS setting of the test's."""
    tag = uuid.uuid4().hex[:10]
    chosen = {
        "FLEET_PG": _server(pg_server_url),
        "FLEET_LEDGER_DB": f"fleet_recipe_ledger_{tag}",
        "FLEET_DAGSTER_DB": f"fleet_recipe_dagster_{tag}",
        "FLEET_BUCKET": f"fleet-recipe-{tag}",
        "FLEET_DIR": str(tmp_path / "fleet"),
        "PIPELINE_CELERY_QUEUE": f"storyboard-recipe-{tag}",
        "PIPELINE_CELERY_BROKER_URL": celery_broker,
        "PIPELINE_CELERY_BACKEND_URL": BACKEND_URL,
        "AWS_ENDPOINT_URL": s3_server.endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": REGION,
    }
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PIPELINE_", "DAGSTER_", "AWS_", "FLEET_", "STORYBOARD_"))
    }
    try:
        yield {**env, **chosen}
    finally:
        delete_queue(celery_broker, chosen["PIPELINE_CELERY_QUEUE"])
        ledger_url = sa.make_url(pg_server_url).set(database=chosen["FLEET_LEDGER_DB"])
        engine_for(ledger_url.render_as_string(hide_password=False)).dispose()
        for name in (chosen["FLEET_LEDGER_DB"], chosen["FLEET_DAGSTER_DB"]):
            drop_database(pg_server_url, name)


def run_recipe(script: Path, env: dict[str, str], log: Path) -> str:
    """``bash script`` from the checkout in a session of its own; its output. Every process
    of that session must be gone once it returns (the workers it started were stopped)."""
    with log.open("wb") as sink:
        shell = subprocess.Popen(
            ["bash", str(script)],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    sid = shell.pid
    try:
        code = shell.wait(timeout=SCRIPT_TIMEOUT)
        output = log.read_text(errors="replace")
        assert code == 0, f"the recipe exited {code}:\n{output[-6000:]}"
        left = wait_session_gone(sid, 30)
        assert left == [], f"still running after the recipe: {left}\n{output[-3000:]}"
        return output
    finally:
        kill_session(sid)  # whatever it left behind: ours, by PID
        if shell.poll() is None:
            shell.wait(10)


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


def test_the_fleet_recipe_runs_as_written(
    machine: dict[str, str], pg_server_url: str, tmp_path: Path
) -> None:
    text = recipe()
    unknown = {
        k for k in machine if k.startswith(("FLEET_", "PIPELINE_", "AWS_"))
    } - documented_variables(text)
    assert unknown == set(), f"set by the test but not documented by the script: {unknown}"
    script = tmp_path / "fleet-recipe.sh"
    script.write_text(text)
    ledger_url = (
        sa.make_url(pg_server_url)
        .set(database=machine["FLEET_LEDGER_DB"])
        .render_as_string(hide_password=False)
    )

    started = time.monotonic()
    first = run_recipe(script, machine, tmp_path / "first.log")
    first_seconds = time.monotonic() - started
    # The episode, registered by the script, completed: every step, on the fleet's workers.
    rows = {k.step_id: r for k, r in ledger_for(ledger_url).get_many(episodes=[EPISODE]).items()}
    assert {s: rows[s].status for s in rows} == {
        s.step_id: StepStatus.COMPLETED for s in STORYBOARD_STEPS
    }, first[-4000:]
    calls = len(ledger_for(ledger_url).provider_calls(episode=EPISODE))
    assert calls > 0
    workers = {int(pid) for pid in WORKER.findall(first)}
    assert workers, f"the status names no fleet worker:\n{first[-4000:]}"
    assert not [pid for pid in workers if _alive(pid)], workers
    logs = sorted(Path(machine["FLEET_DIR"]).glob("worker-*.log"))
    assert len(logs) == 2 and all(" ready." in log.read_text() for log in logs), logs

    # Run again as it is: the databases and the bucket exist, every step skips.
    second = run_recipe(script, machine, tmp_path / "second.log")
    assert len(ledger_for(ledger_url).provider_calls(episode=EPISODE)) == calls, second[-4000:]
    assert "provider calls this run: 0" in second, second[-4000:]
    print(f"first run {first_seconds:.1f}s, both runs {time.monotonic() - started:.1f}s")
