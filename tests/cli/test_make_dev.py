"""``make dev`` stops whole: Ctrl-C (SIGINT to the terminal's process group) or a SIGTERM
sent to ``make`` alone ends every process it started (the webserver, the daemon, the code
server), where ``make`` used to die and leave them running, to be killed by PID.

The real ``make dev`` on a free port, in a session of its own so the test can find (and, if
the product fails, clean up) exactly the processes it started.
"""

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from dagster_dev import free_port

ROOT = Path(__file__).resolve().parents[2]


def _session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            found.append(int(entry.name))
    return found


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
        assert len(_session_pids(sid)) >= 4  # make, dg, webserver, daemon, code server...
        if stop == "ctrl_c":
            os.killpg(sid, signal.SIGINT)  # what the terminal sends its foreground group
        else:
            os.kill(make.pid, signal.SIGTERM)  # make alone, by PID
        deadline = time.monotonic() + 60
        while _session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = _session_pids(sid)
        assert left == [], f"still running after the stop: {left}"
        assert not _answers(port)
    finally:
        for pid in _session_pids(sid):  # whatever the product left: ours, killed by PID
            os.kill(pid, signal.SIGKILL)
        make.wait(10)
