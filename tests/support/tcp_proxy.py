"""A TCP proxy on the loopback that a test cuts: the network fault of one machine, made by
the test, never by stopping the machine's servers (RabbitMQ, Redis, PostgreSQL, moto).

``TcpProxy(port).start()`` listens on ``127.0.0.1:<proxy.port>`` and forwards each
connection to ``127.0.0.1:<port>``. ``cut()`` closes every connection through it (the server
sees its client go, as when a host drops off the network) and refuses new ones until
``restore()`` (``refused`` counts them: a client tried to get through the outage).
Bounded: threads are daemons, and ``close()`` ends them all.
"""

import contextlib
import socket
import threading
from types import TracebackType

_CHUNK = 65536


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self.connections = 0  # accepted and forwarded, in all
        self.cuts = 0  # connections closed by a cut
        self.refused = 0  # connections refused while cut (a client tried through the outage)

    def start(self) -> "TcpProxy":
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()
        return self

    @property
    def live(self) -> int:
        """Connections open through the proxy now (both ends count as one)."""
        with self._lock:
            return len(self._open) // 2

    def cut(self) -> int:
        """Close every connection through the proxy and refuse new ones; how many closed."""
        with self._lock:
            self._cut = True
            victims = list(self._open)
            self._open.clear()
        for sock in victims:
            _kill(sock)
        closed = len(victims) // 2
        self.cuts += closed
        return closed

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()

    def __enter__(self) -> "TcpProxy":
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refused = self._cut
                self.refused += refused
            if refused:
                _kill(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _kill(client)
                continue
            with self._lock:
                if self._cut:
                    self.refused += 1
                    _kill(client)
                    _kill(upstream)
                    continue
                self._open.update((client, upstream))
                self.connections += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(_CHUNK)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass
        with self._lock:
            self._open.discard(source)
            self._open.discard(sink)
        _kill(source)
        _kill(sink)


def _kill(sock: socket.socket) -> None:
    """Close at once: shut both ways so the peer sees the connection end now."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
