"""Named crash points of the run protocol, for crash tests that kill a real process.

``PIPELINE_CRASH_AT=<step>:<stage>`` (or just ``<stage>``, for any step) makes the process
SIGKILL itself when the run protocol of that step reaches that stage: no exception
handler, ``finally`` or atexit runs, exactly as when the machine or the OOM killer stops a
worker. Read per call (never at import) and a no-op unless set. The stages, in order:
``claimed``, ``executed``, ``mutation.pending_written``, ``published``,
``mutation.victim_written`` (after each victim edit), ``finished``; and ``replied.<n>``,
right after the n-th paid reply of the step's run came back and was kept.

Any other value is refused when the code location loads and when the CLI starts
(``check_environment``, naming the variable): a misspelt stage never fired, and a crash
test believed it had killed the process where it had not.
"""

import os
import signal

# Defined in the core, where the start-up check of every PIPELINE_* variable reads them.
from pipeline_defs.resume.settings import CRASH_ENV, CRASH_STAGES, check_crash_point
from pipeline_defs.resume.settings_registry import read

STAGES = CRASH_STAGES
__all__ = ["CRASH_ENV", "STAGES", "check_crash_point", "crash_point"]


def crash_point(stage: str, step_id: str) -> None:
    wanted = read(CRASH_ENV)
    if wanted and wanted in (stage, f"{step_id}:{stage}"):
        os.kill(os.getpid(), signal.SIGKILL)
