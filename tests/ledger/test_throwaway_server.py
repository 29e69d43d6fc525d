"""The test command passes from a checkout in any directory.

As root, a test's own PostgreSQL server runs as an unprivileged user (PostgreSQL refuses
root), and that user cannot enter a directory only root may enter: a checkout under
``mktemp -d`` (mode 0700) or under root's home. The server must start all the same, without
opening any directory outside its own to anyone.
"""

import os
import stat
from pathlib import Path

import sqlalchemy as sa
from must_run import skip_or_fail
from pg_throwaway import ThrowawayPostgres, bundled_install, copy_install


def test_the_server_runs_from_a_checkout_only_root_may_enter(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        skip_or_fail("only root runs the test server as another user")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    # The binaries as a checkout's .venv holds them, under the private directory.
    install = copy_install(bundled_install(), private / "checkout" / ".venv" / "site-packages")
    with ThrowawayPostgres(install=install) as server:
        engine = sa.create_engine(server.url())
        try:
            with engine.connect() as conn:
                assert conn.exec_driver_sql("select 1").scalar() == 1
        finally:
            engine.dispose()
        root = server.root
    assert not root.exists(), "the server's directory (and its copy of the binaries) is gone"
    # Nothing outside the server's own directory was opened up.
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
