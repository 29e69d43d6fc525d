"""A real TCP endpoint in front of an S3 server that fails on purpose, then proxies.

``FlakyEndpoint(upstream)`` listens on 127.0.0.1 (a port the OS picks) and answers each HTTP
request by the next fault of its plan, then forwards the rest to ``upstream`` (the moto
server of ``tests/support/s3_server.py``) byte for byte, the client's ``Host`` header and
signature included. No mock of the client: obstore talks HTTP to a socket, as to a cloud.

Faults, consumed in order by the requests whose method they name (``"*"``: any):

- ``"503"``: answer ``503 Service Unavailable`` (an S3 ``SlowDown``) without forwarding;
- ``"hang"``: read the request and answer nothing, holding the connection for ``hang_s``;
- ``"forward_then_hang"``: forward the request (so it lands upstream), then answer nothing;
- ``"forward_then_503"``: forward it (it lands), then answer 503 instead of the reply;
- ``"reset"``: close the connection without an answer.

``refuse_until(seconds)`` keeps the port bound but not listening for that long: every
connection in that window is refused (``ECONNREFUSED``), as by a store that restarts.
"""

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FAULTS = ("503", "hang", "forward_then_hang", "forward_then_503", "reset")
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Fault:
    kind: str
    method: str = "*"

    def __post_init__(self) -> None:
        assert self.kind in FAULTS, self.kind


@dataclass
class _Plan:
    faults: list[Fault] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)  # "METHOD path -> outcome", in order
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, method: str) -> Fault | None:
        with self.lock:
            for index, fault in enumerate(self.faults):
                if fault.method in ("*", method):
                    return self.faults.pop(index)
        return None

    def record(self, line: str) -> None:
        with self.lock:
            self.seen.append(line)


class FlakyEndpoint:
    """A faulty endpoint before ``upstream``; a context manager (stops its threads on exit)."""

    def __init__(self, upstream: str, *, hang_s: float = 5.0) -> None:
        parts = urlsplit(upstream)
        assert parts.hostname and parts.port, upstream
        self.upstream = (parts.hostname, parts.port)
        self.hang_s = hang_s
        self.plan = _Plan()
        self._stop = threading.Event()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                return

            def _handle(self) -> None:
                endpoint._serve(self)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        self._server.daemon_threads = True
        self._server.server_bind()
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None
        self._serving = False
        self._serving_lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def seen(self) -> list[str]:
        with self.plan.lock:
            return list(self.plan.seen)

    def fail(self, kinds: Iterable[str], method: str = "*") -> None:
        """Queue faults for the next requests of ``method``."""
        with self.plan.lock:
            self.plan.faults.extend(Fault(kind, method) for kind in kinds)

    def start(self, refuse_for_s: float = 0.0) -> "FlakyEndpoint":
        """Serve from now, or refuse every connection for ``refuse_for_s`` first."""

        def serve() -> None:
            if refuse_for_s and self._stop.wait(refuse_for_s):
                return
            with self._serving_lock:
                if self._stop.is_set():
                    return
                self._serving = True
            self._server.server_activate()
            self._server.serve_forever(poll_interval=0.05)

        self._thread = threading.Thread(target=serve, name="flaky-endpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        # Only a loop that started serving is shut down (``shutdown`` waits for it): stopped
        # during its refusal period, the thread ends on its own.
        with self._serving_lock:
            self._stop.set()
            serving = self._serving
        if self._thread is not None:
            if serving:
                self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> "FlakyEndpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- one request ---------------------------------------------------------------------

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        method = handler.command
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        fault = self.plan.take(method)
        kind = fault.kind if fault is not None else "forward"
        self.plan.record(f"{method} {handler.path} -> {kind}")
        if kind == "503":
            self._answer(handler, 503, {"Content-Type": "application/xml"}, _SLOW_DOWN)
            return
        if kind == "reset":
            self._drop(handler)
            return
        if kind == "hang":
            self._hang(handler)
            return
        status, headers, reply = self._forward(handler, method, body)
        if kind == "forward_then_hang":
            self._hang(handler)
        elif kind == "forward_then_503":
            self._answer(handler, 503, {"Content-Type": "application/xml"}, _SLOW_DOWN)
        else:
            self._answer(handler, status, headers, reply, head=method == "HEAD")

    def _forward(
        self, handler: BaseHTTPRequestHandler, method: str, body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            headers = {k: v for k, v in handler.headers.items() if k.lower() != "connection"}
            conn.request(method, handler.path, body=body or None, headers=headers)
            response = conn.getresponse()
            reply = response.read()
            kept = {
                k: v
                for k, v in response.getheaders()
                if k.lower() not in ("connection", "transfer-encoding", "content-length", "server")
            }
            if method == "HEAD":
                kept["Content-Length"] = response.getheader("Content-Length") or "0"
            return response.status, kept, reply
        finally:
            conn.close()

    @staticmethod
    def _answer(
        handler: BaseHTTPRequestHandler,
        status: int,
        headers: dict[str, str],
        body: bytes,
        *,
        head: bool = False,
    ) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        if not head:
            handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if body and not head:
            handler.wfile.write(body)
        handler.wfile.flush()

    def _hang(self, handler: BaseHTTPRequestHandler) -> None:
        self._stop.wait(self.hang_s)
        self._drop(handler)

    @staticmethod
    def _drop(handler: BaseHTTPRequestHandler) -> None:
        handler.close_connection = True
        with contextlib.suppress(OSError):
            handler.connection.shutdown(socket.SHUT_RDWR)


def wait_listening(port: int, timeout_s: float = 5.0) -> None:
    """Block until 127.0.0.1:``port`` accepts a connection."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
