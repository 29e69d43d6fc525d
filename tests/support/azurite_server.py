"""An Azure Blob endpoint for tests: the azurite emulator (npm) on 127.0.0.1, in memory.

``running_azurite()`` starts ``azurite-blob`` on a port the OS picks, with an account of our
own (``ACCOUNT``, key ``ACCOUNT_KEY``: a recognisable credential no message may show), and
stops it afterwards; each test takes a fresh container (``new_container``) and the
environment an ``az://`` storage is configured from (``env``). The emulator is found as
``PIPELINE_AZURITE`` (a path), ``.azurite/node_modules/.bin/azurite-blob`` in the checkout
(``make azurite`` installs it there with npm) or ``azurite-blob`` on the PATH. When it cannot
start the tests are skipped, or failed when ``CI`` is set or ``PIPELINE_REQUIRE_AZURE=1``
(set by ``.ci/run``).
"""

import base64
import hashlib
import hmac
import http.client
import os
import re
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ACCOUNT = "storyboardtests"
# A valid base64 account key (azurite checks signatures with it), recognisable in any text.
ACCOUNT_KEY = base64.b64encode(b"AzUrE-sEcReT-storyboard-account-key-0123456789").decode()
_API_VERSION = "2021-08-06"
_CHECKOUT = Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"successfully listens on (http://\S+)")


def require_azure() -> bool:
    """True when an emulator that cannot start must fail the tests, not skip them."""
    return bool(os.environ.get("CI")) or os.environ.get("PIPELINE_REQUIRE_AZURE", "") not in (
        "",
        "0",
        "false",
    )


def azurite_command() -> str | None:
    """The ``azurite-blob`` executable, or None when none is installed."""
    given = os.environ.get("PIPELINE_AZURITE")
    if given:
        return given
    local = _CHECKOUT / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    return shutil.which("azurite-blob")


@dataclass(frozen=True)
class AzureServer:
    """A running azurite: its endpoint, and what an ``az://`` storage over it needs."""

    endpoint: str  # http://127.0.0.1:PORT

    @property
    def account_url(self) -> str:
        return f"{self.endpoint}/{ACCOUNT}"

    def new_container(self) -> str:
        """A new, empty container with a name no other test uses (Shared Key signed)."""
        name = f"t-{uuid.uuid4().hex[:24]}"
        status = self._put(f"/{ACCOUNT}/{name}", "restype=container")
        if status != 201:
            raise RuntimeError(f"azurite refused to create container {name}: HTTP {status}")
        return name

    def env(self) -> dict[str, str]:
        """The variables obstore configures an Azure client from (the only source we use)."""
        return {
            "AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": ACCOUNT_KEY,
            "AZURE_STORAGE_ENDPOINT": self.account_url,
            "AZURE_ALLOW_HTTP": "true",
        }

    def _put(self, path: str, query: str) -> int:
        """An empty PUT signed with the account key (Shared Key, path-style account)."""
        date = formatdate(usegmt=True)
        headers = {"x-ms-date": date, "x-ms-version": _API_VERSION}
        resource = f"/{ACCOUNT}{path}" + "".join(
            f"\n{k}:{v}" for k, v in sorted(p.split("=", 1) for p in query.split("&"))
        )
        canonical = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
        to_sign = "PUT\n" + "\n" * 11 + canonical + resource
        key = base64.b64decode(ACCOUNT_KEY)
        digest = hmac.new(key, to_sign.encode(), hashlib.sha256).digest()
        headers["Authorization"] = f"SharedKey {ACCOUNT}:{base64.b64encode(digest).decode()}"
        parts = urlsplit(self.endpoint)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
        try:
            conn.request("PUT", f"{path}?{query}", body=b"", headers=headers)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()


@contextmanager
def running_azurite() -> Iterator[AzureServer]:
    """An azurite Blob service for the duration of the block (skip or fail if it cannot)."""
    process: subprocess.Popen[str] | None = None
    workspace = tempfile.mkdtemp(prefix="azurite-")  # nothing is kept: in-memory persistence
    try:
        command = azurite_command()
        if command is None:
            raise FileNotFoundError(
                "azurite-blob is not installed (`make azurite` installs it with npm)"
            )
        process = subprocess.Popen(
            [
                command,
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                "0",
                "--inMemoryPersistence",
                "--disableTelemetry",
            ],
            cwd=workspace,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "AZURITE_ACCOUNTS": f"{ACCOUNT}:{ACCOUNT_KEY}"},
        )
        endpoint = _wait_listening(process)
        running = AzureServer(endpoint)
        running.new_container()  # it answers, and takes our account's signature
    except Exception as exc:
        if process is not None:
            _stop(process)
        shutil.rmtree(workspace, ignore_errors=True)
        message = f"Azure tests cannot run: azurite did not start: {type(exc).__name__}: {exc}"
        if require_azure():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    # Keep reading its output (the access log) so a full pipe never blocks the emulator.
    drain = threading.Thread(target=_drain, args=(process,), daemon=True)
    drain.start()
    try:
        yield running
    finally:
        _stop(process)
        shutil.rmtree(workspace, ignore_errors=True)


def _wait_listening(process: "subprocess.Popen[str]") -> str:
    """The endpoint azurite prints once it listens (its first lines), or why it did not."""
    assert process.stdout is not None
    seen: list[str] = []
    timer = threading.Timer(60, process.kill)
    timer.start()
    try:
        for line in process.stdout:
            seen.append(line.rstrip())
            found = _LISTENING.search(line)
            if found:
                return found.group(1)
    finally:
        timer.cancel()
    raise RuntimeError(f"azurite exited ({process.wait()}): {' | '.join(seen[-5:])}")


def _drain(process: "subprocess.Popen[str]") -> None:
    assert process.stdout is not None
    for _ in process.stdout:
        pass


def _stop(process: "subprocess.Popen[str]") -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
