"""``python -m pipeline_defs.cli.supervise COMMAND...``: run a process tree that stops whole.

``make dev`` starts ``dg dev``, which starts the webserver, the daemon and a code server.
Stopped by Ctrl-C or by a SIGTERM sent to ``make`` alone, that tree used to live on (``make``
died, its children were orphaned and had to be killed by PID). Here the command runs in a
process group of its own (in the same session: a terminal's Ctrl-C reaches this process, which
passes it on); on SIGINT, SIGTERM or SIGHUP, or when this process's parent goes
away (``make`` killed by PID), the whole group is asked to stop (SIGINT, as Ctrl-C asks
``dagster dev``), then told (SIGTERM), then killed (SIGKILL), each after a grace period.
The exit status is the command's own, or 128 + the signal that stopped it.
"""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import FrameType

GRACE_SECONDS = 20.0  # for the tree to stop on SIGINT before it is sent SIGTERM
POLL_SECONDS = 0.5


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, reap: "subprocess.Popen[bytes]", grace: float = GRACE_SECONDS) -> None:
    """Ask, then tell, then force every process of the group to stop."""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            reap.poll()  # the leader, once it exits, must not linger as a zombie
            if not _group_alive(pgid):
                return
            time.sleep(0.1)


def supervise(command: Sequence[str], *, grace: float = GRACE_SECONDS) -> int:
    """Run ``command`` in its own process group until it exits or we are told to stop."""
    parent = os.getppid()
    received: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    child = subprocess.Popen(list(command), process_group=0)
    while True:
        try:
            code = child.wait(timeout=POLL_SECONDS)
        except subprocess.TimeoutExpired:
            code = None
        if code is not None:
            stop_group(child.pid, child, grace)  # whatever it left behind
            return code
        if received or os.getppid() != parent:
            stop_group(child.pid, child, grace)
            return 128 + (received[0] if received else signal.SIGHUP)


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: python -m pipeline_defs.cli.supervise COMMAND [ARG...]", file=sys.stderr)
        return 2
    return supervise(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
