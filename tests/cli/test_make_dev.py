"""``make dev`` stops whole: Ctrl-C (SIGINT to the terminal's process group) or a SIGTERM
sent to ``make`` alone ends every process it started (the webserver, the daemon, the code
server), where ``make`` used to die and leave them running, to be killed by PID. The same when
it was started in the background, where SIGINT is ignored; and it is the only way the README and
docs/OPERATING.md give to start the UI (Dagster's own dagster dev, started in the background,
ignores SIGTERM too and leaves six processes behind).

The real ``make dev`` on a free port, in a session of its own so the test can find (and, if
the product fails, clean up) exactly the processes it started.
"""

import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from dagster_dev import free_port
from process_sessions import kill_session, session_pids, wait_session_gone

ROOT = Path(__file__).resolve().parents[2]


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.webserver
@pytest.mark.parametrize("stop", ["sigterm_to_make", "ctrl_c"])
def test_make_dev_stops_every_process_it_started(tmp_path: Path, stop: str) -> None:
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "PIPELINE_HOME": str(tmp_path / "home"),
    }
    make = subprocess.Popen(
        ["make", "dev", f"PORT={port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    sid = make.pid
    try:
        deadline = time.monotonic() + 180
        while not _answers(port):
            assert make.poll() is None, "make dev exited before the UI answered"
            assert time.monotonic() < deadline, "the UI never answered"
            time.sleep(0.5)
        assert len(session_pids(sid)) >= 4  # make, dg, webserver, daemon, code server...
        if stop == "ctrl_c":
            os.killpg(sid, signal.SIGINT)  # what the terminal sends its foreground group
        else:
            os.kill(make.pid, signal.SIGTERM)  # make alone, by PID
        left = wait_session_gone(sid, 60)
        assert left == [], f"still running after the stop: {left}"
        assert not _answers(port)
    finally:
        kill_session(sid)  # whatever the product left: ours, killed by PID
        make.wait(10)


DOCS = ("README.md", "docs/OPERATING.md")
# A command that starts the UI, in a code span or on a line of a code block: variables, then
# make, dagster or dg (any path to them), then ``dev``.
_UI_COMMAND = r"(?:[A-Z_]+=\S* )*(?:\S*/)?(?:make|dagster|dg) dev\b[^`\n]*"
UI_COMMAND = re.compile(rf"`({_UI_COMMAND})`|^[ \t]*({_UI_COMMAND})$", re.MULTILINE)
# In prose, a span of the bare words names the program ("through a real `dagster dev`").
PROGRAM_NAMES = {"dagster dev", "dg dev"}
# The way that stops whole (any port, in the foreground or in the background).
STOPS_WHOLE = re.compile(r"make dev(?: PORT=\d+)?(?: &)?")


def documented_ui_commands() -> dict[str, list[str]]:
    """Per document, the commands it gives for starting the UI."""
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        spans = [a for a, _ in UI_COMMAND.findall(text) if a and a not in PROGRAM_NAMES]
        lines = [b for _, b in UI_COMMAND.findall(text) if b]
        found[doc] = spans + lines
    return found


def test_the_docs_start_the_ui_only_the_way_that_stops_whole() -> None:
    commands = documented_ui_commands()
    assert commands["README.md"], "the README names no way to start the UI"
    others = {
        doc: [c for c in found if not STOPS_WHOLE.fullmatch(c.strip())]
        for doc, found in commands.items()
    }
    assert others == {doc: [] for doc in DOCS}, (
        f"started in the background, these ignore SIGTERM and leave their processes: {others}"
    )


def _ignores_sigint(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)))
    raise AssertionError(f"no SigIgn line for {pid}")


@pytest.mark.webserver
def test_make_dev_in_the_background_stops_whole_on_sigterm(tmp_path: Path) -> None:
    """``make dev &`` in a shell script (a background job, SIGINT ignored), then a SIGTERM to
    make's PID: every process it started is gone within a minute."""
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "PIPELINE_HOME": str(tmp_path / "home"),
    }
    log = tmp_path / "make-dev.log"
    shell = subprocess.Popen(
        ["bash", "-c", f'make dev PORT={port} >"$1" 2>&1 & echo $!; wait', "bash", str(log)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    sid = shell.pid
    try:
        assert shell.stdout is not None
        make_pid = int(shell.stdout.readline())
        deadline = time.monotonic() + 180
        while not _answers(port):
            output = log.read_text() if log.exists() else ""
            assert shell.poll() is None, f"make dev exited before the UI answered:\n{output}"
            assert time.monotonic() < deadline, f"the UI never answered:\n{output}"
            time.sleep(0.5)
        assert _ignores_sigint(make_pid), "make was not started as a background job"
        started = session_pids(sid)
        assert len(started) >= 5, started  # bash, make, dg, webserver, daemon, code server...
        os.kill(make_pid, signal.SIGTERM)
        left = wait_session_gone(sid, 60)
        assert left == [], f"still running after the SIGTERM: {left}"
        assert not _answers(port)
    finally:
        kill_session(sid)  # whatever the product left: ours, killed by PID
        shell.wait(10)
