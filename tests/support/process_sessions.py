"""The processes of a session a test started (``start_new_session=True``): what the command
under test started, found through ``/proc`` so that none of them can hide by name or by a
new process group, and stopped, if the product left any, by PID only."""

import contextlib
import os
import signal
import time
from pathlib import Path


def session_pids(sid: int) -> list[int]:
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


def wait_session_gone(sid: int, timeout: float) -> list[int]:
    """Poll until session ``sid`` has no live process or ``timeout`` passed; what is left."""
    deadline = time.monotonic() + timeout
    while (left := session_pids(sid)) and time.monotonic() < deadline:
        time.sleep(0.25)
    return left


def kill_session(sid: int) -> None:
    """SIGKILL whatever is left of session ``sid``: processes a test started, by PID."""
    for pid in session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
