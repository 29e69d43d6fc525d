"""A real ``dagster dev`` (webserver + daemon) started by a test, and its GraphQL API.

Shared by the tests that must see what Dagster does with what our code returns: the
launch-path tests and the daemon-path sensor tests. The process runs in its own process
group and is stopped by that group (never by name), so only our own processes are touched.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

WORKSPACE_QUERY = """
{ workspaceOrError { __typename ... on Workspace { locationEntries {
    name loadStatus locationOrLoadError { __typename } } } } }
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def create_database(server_url: str, prefix: str) -> tuple[str, str]:
    """A new PostgreSQL database on ``server_url``: (name, URL)."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    return name, sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, name: str) -> None:
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


def graphql(url: str, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body = json.dumps({"query": query, "variables": dict(variables or {})}).encode()
    request = urllib.request.Request(
        f"{url}/graphql", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        payload: dict[str, Any] = json.loads(response.read())
    assert "errors" not in payload, payload
    data: dict[str, Any] = payload["data"]
    return data


def write_workspace(path: Path, module: str, attribute: str, location: str, cwd: Path) -> Path:
    spec = {
        "python_module": {
            "module_name": module,
            "attribute": attribute,
            "location_name": location,
            "working_directory": str(cwd),
        }
    }
    path.write_text(yaml.safe_dump({"load_from": [spec]}))
    return path


def log_tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def wait_until_loaded(
    url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 240
) -> None:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"dagster dev exited:\n{log_tail(log)}")
        try:
            data = graphql(url, WORKSPACE_QUERY)["workspaceOrError"]
            entries = data.get("locationEntries", [])
            last = entries
            if entries and all(
                e["loadStatus"] == "LOADED"
                and e["locationOrLoadError"]["__typename"] == "RepositoryLocation"
                for e in entries
            ):
                return
            if any(e["locationOrLoadError"] and e["loadStatus"] == "LOADED" for e in entries):
                raise AssertionError(f"code location failed to load: {entries}")
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"webserver not ready ({last}):\n{log_tail(log)}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop ``dagster dev`` and its children by process group (never by name)."""
    if process.poll() is not None:
        return
    pgid = os.getpgid(process.pid)
    os.killpg(pgid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):  # grandchildren that outlived dagster dev
        os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def dagster_dev(
    workspace: Path, env: Mapping[str, str], cwd: Path, log: Path
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Start ``dagster dev -w workspace``; yield (url, process) once the location loaded."""
    port = free_port()
    dagster = str(Path(sys.executable).with_name("dagster"))
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [dagster, "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port)],
            cwd=cwd,
            env=dict(env),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as one below
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_loaded(url, process, log)
        yield url, process
    finally:
        stop(process)


START_SENSOR = """
mutation($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status } }
    ... on PythonError { message }
  }
}
"""


def sensor_selector(location: str, sensor: str = "resume_sensor") -> dict[str, str]:
    return {
        "repositoryLocationName": location,
        "repositoryName": "__repository__",
        "sensorName": sensor,
    }


def start_sensor(url: str, location: str, sensor: str = "resume_sensor") -> None:
    """Turn a sensor on, as an operator does in the UI (it may start STOPPED)."""
    selector = sensor_selector(location, sensor)
    started = graphql(url, START_SENSOR, {"selector": selector})["startSensor"]
    assert started["__typename"] == "Sensor", started


def start_dagster_dev(
    workspace: Path, env: Mapping[str, str], cwd: Path, log: Path
) -> tuple[str, subprocess.Popen[bytes]]:
    """``dagster dev -w workspace`` started now, in its own process group, not waited for
    (it loads while the test goes on; :func:`wait_until_loaded`, :func:`stop`)."""
    port = free_port()
    dagster = str(Path(sys.executable).with_name("dagster"))
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [dagster, "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port)],
            cwd=cwd,
            env=dict(env),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return f"http://127.0.0.1:{port}", process
