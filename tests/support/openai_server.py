"""A local OpenAI-compatible HTTP server for the provider tests (stdlib ``http.server``).

Not a test module. Each path answers from a script of replies (the last one repeats, or,
with ``fallback``, is followed by the fallback answer). The fallback answers like a real
endpoint by running the offline models behind the HTTP API: chat completions return the
offline text model's JSON for the task named in the system message, image generations a
base64 PNG drawn by the offline image model. So the whole pipeline can run against it.
"""

import base64
import hashlib
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from resources.providers import ImageCall, OfflineImageModel, OfflineTextModel, TextCall

CHAT = "/chat/completions"
IMAGES = "/images/generations"


@dataclass
class Reply:
    """One scripted HTTP answer; ``delay`` sleeps before answering to provoke timeouts."""

    status: int = 200
    body: bytes | dict[str, Any] = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Seen:
    """One request received; header names lower-cased (HTTP names are case-insensitive)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float = 0.0  # time.monotonic() when it arrived


def chat_body(
    content: str, *, model: str = "gpt-test-2024", total_tokens: int | None = 42
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
    }
    if total_tokens is not None:
        body["usage"] = {
            "prompt_tokens": total_tokens - 12 if total_tokens > 12 else 0,
            "completion_tokens": min(12, total_tokens),
            "total_tokens": total_tokens,
        }
    return body


def offline_chat(request: dict[str, Any]) -> Reply:
    """What a real endpoint would answer, computed by the offline text model."""
    system, user = request["messages"][0]["content"], request["messages"][1]["content"]
    task = system.removeprefix("You are the ").split(" step of", 1)[0]
    prompt, _, payload = user.partition("\n\nINPUT:\n")
    reply = OfflineTextModel().complete(TextCall(task, prompt, json.loads(payload)))
    content = json.dumps(reply.data)
    tokens = (len(user) + len(content)) // 4 + 1
    return Reply(body=chat_body(content, model=request["model"], total_tokens=tokens))


def offline_image(request: dict[str, Any]) -> Reply:
    width, height = (int(v) for v in str(request["size"]).split("x"))
    seed = hashlib.sha256(request["prompt"].encode()).hexdigest()
    png = OfflineImageModel().generate(ImageCall(request["prompt"], "", width, height, seed)).png
    return Reply(
        body={
            "created": 0,
            "data": [{"b64_json": base64.b64encode(png).decode()}],
            "usage": {"input_tokens": 10, "output_tokens": 90, "total_tokens": 100},
        }
    )


FALLBACKS: dict[str, Callable[[dict[str, Any]], Reply]] = {
    CHAT: offline_chat,
    IMAGES: offline_image,
}


@dataclass
class SlidingLimit:
    """An endpoint's rate limit as a real one counts it: at most ``per_window`` requests of
    a model in any sliding ``window`` seconds; beyond it a 429 with ``Retry-After`` (whole
    seconds, until the oldest request counted leaves the window). Refused requests do not
    count; ``refused`` is how many were answered 429."""

    per_window: int
    window: float = 60.0
    accepted: dict[str, deque[float]] = field(default_factory=dict)
    refused: int = 0
    times: list[float] = field(default_factory=list)

    def admit(self, model: str, now: float) -> Reply | None:
        """None when the request is admitted, else the 429 to answer."""
        seen = self.accepted.setdefault(model, deque())
        while seen and seen[0] <= now - self.window:
            seen.popleft()
        if len(seen) < self.per_window:
            seen.append(now)
            self.times.append(now)
            return None
        self.refused += 1
        wait = max(1, math.ceil(seen[0] + self.window - now))
        return Reply(
            429,
            {"error": {"message": "Rate limit reached", "type": "requests"}},
            headers={"retry-after": str(wait)},
        )


class FakeOpenAI:
    """Scripts per-path replies and records every request (headers and JSON body)."""

    def __init__(self, *, fallback: bool = False) -> None:
        self.scripts: dict[str, list[Reply]] = {}
        self.requests: list[Seen] = []
        self.lock = threading.Lock()
        self.base_url = ""
        self.fallback = fallback
        # Asked first for every request: a Reply answers it, None leaves it to the scripts.
        self.rule: Callable[[str, dict[str, Any]], Reply | None] | None = None
        # The endpoint's rate limit, if it enforces one (asked before the rule).
        self.limit: SlidingLimit | None = None

    def script(self, path: str, *replies: Reply) -> None:
        with self.lock:
            self.scripts[path] = list(replies)

    def next_reply(self, path: str, request: dict[str, Any]) -> Reply:
        with self.lock:
            if self.limit is not None:
                refused = self.limit.admit(str(request.get("model", "")), time.monotonic())
                if refused is not None:
                    return refused
            ruled = self.rule(path, request) if self.rule is not None else None
            if ruled is not None:
                return ruled
            queue = self.scripts.get(path)
            if queue and (len(queue) > 1 or self.fallback):
                return queue.pop(0)
            if queue:
                return queue[0]
        if self.fallback and path in FALLBACKS:
            return FALLBACKS[path](request)
        return Reply(404, {"error": {"message": f"no script for {path}"}})

    def seen(self, path: str) -> list[Seen]:
        with self.lock:
            return [r for r in self.requests if r.path == path]


def _handler_for(server: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            path = self.path.removeprefix("/v1")
            request = json.loads(raw)
            headers = {name.lower(): value for name, value in self.headers.items()}
            with server.lock:
                server.requests.append(Seen(path, headers, request, time.monotonic()))
            reply = server.next_reply(path, request)
            if reply.delay:
                time.sleep(reply.delay)
            body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test); nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serving(*, fallback: bool = False) -> Iterator[FakeOpenAI]:
    """The server on an ephemeral localhost port, stopped on exit."""
    fake = FakeOpenAI(fallback=fallback)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(fake))
    httpd.daemon_threads = True
    fake.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
