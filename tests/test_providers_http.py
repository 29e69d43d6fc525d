"""OpenAI-compatible providers against a real local HTTP server with scripted answers."""

import base64
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import dagster as dg
import pytest
from PIL import Image

from pipeline_defs.resume.errors import PipelineError
from resources.providers import (
    BAD_RESPONSE,
    CONFIG_ERROR,
    HTTP_ERROR,
    RETRIES_EXHAUSTED,
    ImageCall,
    OpenAIImageModel,
    OpenAITextModel,
    TextCall,
    TextModel,
)
from resources.providers.openai_http import backoff_delay, parse_json_object, parse_retry_after

API_KEY = "sk-test-DO-NOT-LEAK-1234567890"
CALL = TextCall(
    task="entity_canon", prompt="List the characters.", payload={"story": "Ann met Bo."}
)


@dataclass
class Reply:
    """One scripted HTTP answer; ``delay`` sleeps before answering to provoke timeouts."""

    status: int = 200
    body: bytes | dict[str, Any] = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class FakeServer:
    """Scripts per-path replies (the last one repeats forever) and records every request."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Reply]] = {}
        self.requests: list[Seen] = []
        self.lock = threading.Lock()
        self.base_url = ""

    def script(self, path: str, *replies: Reply) -> None:
        self.scripts[path] = list(replies)

    def next_reply(self, path: str) -> Reply:
        with self.lock:
            queue = self.scripts.get(path)
            if not queue:
                return Reply(404, {"error": {"message": f"no script for {path}"}})
            return queue.pop(0) if len(queue) > 1 else queue[0]

    def seen(self, path: str) -> list[Seen]:
        return [r for r in self.requests if r.path == path]


def _handler_for(server: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            path = self.path.removeprefix("/v1")
            with server.lock:
                server.requests.append(Seen(path, dict(self.headers.items()), json.loads(raw)))
            reply = server.next_reply(path)
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


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer()
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


def text_model(server: FakeServer, **overrides: Any) -> OpenAITextModel:
    config: dict[str, Any] = {
        "base_url": server.base_url,
        "model": "gpt-test",
        "api_key": API_KEY,
        "timeout_seconds": 2.0,
        "max_retries": 2,
        "backoff_seconds": 0.001,
        "max_backoff_seconds": 0.01,
    }
    config.update(overrides)
    return OpenAITextModel(**config)


def chat(content: str, *, total_tokens: int | None = 42) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "model": "gpt-test-2024",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
    }
    if total_tokens is not None:
        body["usage"] = {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": total_tokens}
    return body


def assert_no_key(err: BaseException) -> None:
    """The key must not surface in anything that reaches logs, metadata or checkpoints."""
    texts = [str(err), repr(err)]
    if isinstance(err, PipelineError):
        texts += [err.message, repr(err.details), repr(err.as_metadata())]
    cause = err.__cause__
    while cause is not None:
        texts += [str(cause), repr(cause)]
        cause = cause.__cause__
    for text in texts:
        assert API_KEY not in text


def png_bytes(width: int = 8, height: int = 6) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


class RecordingTextModel(OpenAITextModel):
    """Records backoff delays instead of sleeping, to check the retry schedule exactly."""

    sleeps: ClassVar[list[float]] = []

    def _sleep(self, seconds: float) -> None:
        RecordingTextModel.sleeps.append(seconds)


# --- text --------------------------------------------------------------------------------


def test_chat_completion_parsed_and_request_shape(server: FakeServer) -> None:
    server.script("/chat/completions", Reply(body=chat('{"characters": [{"id": "C01"}]}')))

    reply = text_model(server).complete(CALL)

    assert reply.data == {"characters": [{"id": "C01"}]}
    assert reply.units == 42
    assert reply.model == "gpt-test-2024"
    (seen,) = server.seen("/chat/completions")
    assert seen.headers["Authorization"] == f"Bearer {API_KEY}"
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.body["model"] == "gpt-test"
    assert seen.body["response_format"] == {"type": "json_object"}
    system, user = seen.body["messages"]
    assert system == {
        "role": "system",
        "content": "You are the entity_canon step of a storyboard pipeline. "
        "Answer with one JSON object only.",
    }
    assert user["role"] == "user"
    prompt, _, payload = user["content"].partition("\n\nINPUT:\n")
    assert prompt == "List the characters."
    assert json.loads(payload) == {"story": "Ann met Bo."}


def test_fenced_json_content_is_tolerated(server: FakeServer) -> None:
    content = 'Here you go:\n```json\n{"scenes": [1, 2]}\n```\nAnything else?'
    server.script("/chat/completions", Reply(body=chat(content, total_tokens=None)))

    reply = text_model(server).complete(CALL)

    assert reply.data == {"scenes": [1, 2]}
    assert reply.units == 1  # no usage block → one unit per call


def test_non_json_content_is_bad_response(server: FakeServer) -> None:
    server.script("/chat/completions", Reply(body=chat("Sorry, I cannot help with that.")))

    with pytest.raises(PipelineError) as info:
        text_model(server).complete(CALL)

    assert info.value.code == BAD_RESPONSE
    assert "no JSON object" in info.value.message
    assert len(server.seen("/chat/completions")) == 1  # a contract breach is not retried
    assert_no_key(info.value)


@pytest.mark.parametrize(
    "body",
    [
        b"<html>gateway page</html>",
        {"choices": []},
        {"choices": [{"message": {"role": "assistant", "content": None}}]},
        chat('["a list", "not an object"]'),
    ],
    ids=["html-body", "no-choices", "null-content", "json-array"],
)
def test_malformed_completion_is_bad_response(server: FakeServer, body: Any) -> None:
    server.script("/chat/completions", Reply(body=body))

    with pytest.raises(PipelineError) as info:
        text_model(server).complete(CALL)

    assert info.value.code == BAD_RESPONSE
    assert_no_key(info.value)


def test_429_twice_then_success(server: FakeServer) -> None:
    server.script(
        "/chat/completions",
        Reply(429, {"error": "slow down"}, {"Retry-After": "0"}),
        Reply(429, {"error": "slow down"}, {"Retry-After": "0"}),
        Reply(body=chat('{"ok": true}')),
    )

    reply = text_model(server, max_retries=4).complete(CALL)

    assert reply.data == {"ok": True}
    assert len(server.seen("/chat/completions")) == 3


def test_backoff_is_exponential_capped_and_honours_retry_after(server: FakeServer) -> None:
    server.script(
        "/chat/completions",
        Reply(503, b"busy"),
        Reply(503, b"busy"),
        Reply(429, b"later", {"Retry-After": "0.25"}),
        Reply(429, b"later", {"Retry-After": "3600"}),
        Reply(503, b"busy"),
        Reply(body=chat('{"ok": 1}')),
    )
    RecordingTextModel.sleeps.clear()
    model = RecordingTextModel(
        base_url=server.base_url,
        model="gpt-test",
        api_key=API_KEY,
        max_retries=5,
        backoff_seconds=0.1,
        max_backoff_seconds=0.3,
    )

    assert model.complete(CALL).data == {"ok": 1}
    assert RecordingTextModel.sleeps == pytest.approx([0.1, 0.2, 0.25, 0.3, 0.3])


def test_500_forever_exhausts_retries(server: FakeServer) -> None:
    server.script("/chat/completions", Reply(500, {"error": "boom"}))

    with pytest.raises(PipelineError) as info:
        text_model(server, max_retries=3).complete(CALL)

    assert info.value.code == RETRIES_EXHAUSTED
    assert len(server.seen("/chat/completions")) == 4
    assert "4 attempts" in info.value.message and "HTTP 500" in info.value.message
    assert_no_key(info.value)


def test_400_is_http_error_immediately_and_redacted(server: FakeServer) -> None:
    # A hostile/buggy endpoint echoing the credential must not leak it through our error.
    echo = {"error": {"message": f"bad request; you sent Authorization: Bearer {API_KEY}"}}
    server.script("/chat/completions", Reply(400, echo))

    with pytest.raises(PipelineError) as info:
        text_model(server, max_retries=4).complete(CALL)

    err = info.value
    assert err.code == HTTP_ERROR
    assert len(server.seen("/chat/completions")) == 1
    assert "400" in err.message and "bad request" in err.message
    assert err.details["http_status"] == 400
    assert_no_key(err)


def test_slow_server_times_out_then_retries_exhausted(server: FakeServer) -> None:
    server.script("/chat/completions", Reply(body=chat('{"late": true}'), delay=0.6))

    started = time.monotonic()
    with pytest.raises(PipelineError) as info:
        text_model(server, timeout_seconds=0.15, max_retries=1).complete(CALL)

    assert info.value.code == RETRIES_EXHAUSTED
    assert "timed out" in info.value.message.lower()
    assert len(server.seen("/chat/completions")) == 2
    assert time.monotonic() - started < 2.0
    assert_no_key(info.value)


def test_connection_refused_exhausts_retries() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAITextModel(
        base_url=f"http://127.0.0.1:{port}/v1",
        model="m",
        api_key=API_KEY,
        max_retries=1,
        backoff_seconds=0.001,
    )

    with pytest.raises(PipelineError) as info:
        model.complete(CALL)

    assert info.value.code == RETRIES_EXHAUSTED
    assert_no_key(info.value)


@pytest.mark.parametrize(
    ("base_url", "model"),
    [("", "m"), ("   ", "m"), ("http://127.0.0.1:9/v1", ""), ("ftp://example.org/v1", "m")],
    ids=["empty-url", "blank-url", "empty-model", "bad-scheme"],
)
def test_config_errors_fail_before_network(base_url: str, model: str) -> None:
    resource = OpenAITextModel(base_url=base_url, model=model, api_key=API_KEY)

    with pytest.raises(PipelineError) as info:
        resource.complete(CALL)

    assert info.value.code == CONFIG_ERROR
    assert_no_key(info.value)


def test_api_key_with_control_characters_is_rejected_without_echo(server: FakeServer) -> None:
    bad_key = API_KEY + "\r\nX-Evil: 1"
    with pytest.raises(PipelineError) as info:
        text_model(server, api_key=bad_key).complete(CALL)

    assert info.value.code == CONFIG_ERROR
    assert_no_key(info.value)
    assert server.requests == []


def test_no_api_key_sends_no_authorization(server: FakeServer) -> None:
    server.script("/chat/completions", Reply(body=chat('{"ok": true}')))

    text_model(server, api_key=None).complete(CALL)

    assert "Authorization" not in server.requests[0].headers


def test_resource_repr_hides_api_key(server: FakeServer) -> None:
    model = text_model(server)
    assert API_KEY not in repr(model)
    assert API_KEY not in str(model)


def test_env_var_key_resolved_inside_dagster_run(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIPELINE_PROVIDER_API_KEY", API_KEY)
    server.script("/chat/completions", Reply(body=chat('{"characters": []}')))
    resource = OpenAITextModel(
        base_url=server.base_url,
        model="gpt-test",
        api_key=dg.EnvVar("PIPELINE_PROVIDER_API_KEY"),
    )

    @dg.asset
    def entity_canon(text: TextModel) -> dict[str, Any]:
        return text.complete(CALL).data

    result = dg.materialize([entity_canon], resources={"text": resource})

    assert result.success
    assert result.output_for_node("entity_canon") == {"characters": []}
    assert server.requests[0].headers["Authorization"] == f"Bearer {API_KEY}"


def test_env_var_key_resolved_when_called_directly(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIPELINE_PROVIDER_API_KEY", API_KEY)
    server.script("/chat/completions", Reply(body=chat('{"ok": true}')))

    text_model(server, api_key=dg.EnvVar("PIPELINE_PROVIDER_API_KEY")).complete(CALL)

    assert server.requests[0].headers["Authorization"] == f"Bearer {API_KEY}"


# --- images ------------------------------------------------------------------------------


def image_model(server: FakeServer, **overrides: Any) -> OpenAIImageModel:
    config: dict[str, Any] = {
        "base_url": server.base_url,
        "model": "img-test",
        "api_key": API_KEY,
        "max_retries": 1,
        "backoff_seconds": 0.001,
    }
    config.update(overrides)
    return OpenAIImageModel(**config)


IMAGE_CALL = ImageCall(prompt="a lighthouse", caption="S1", width=64, height=48, seed="abc")


def test_image_generation_returns_decoded_png(server: FakeServer) -> None:
    png = png_bytes()
    encoded = base64.b64encode(png).decode()
    server.script("/images/generations", Reply(body={"data": [{"b64_json": encoded}]}))

    reply = image_model(server).generate(IMAGE_CALL)

    assert reply.png == png
    assert reply.units == 1
    assert reply.model == "img-test"
    (seen,) = server.seen("/images/generations")
    assert seen.headers["Authorization"] == f"Bearer {API_KEY}"
    assert seen.body == {
        "model": "img-test",
        "prompt": "a lighthouse",
        "size": "64x48",
        "response_format": "b64_json",
        "n": 1,
    }


@pytest.mark.parametrize(
    "body",
    [
        {"data": [{"b64_json": base64.b64encode(b"GIF89a not a png").decode()}]},
        {"data": [{"b64_json": "!!!not base64!!!"}]},
        {"data": [{"url": "https://cdn.example/img.png"}]},
        {"data": []},
    ],
    ids=["not-png", "bad-base64", "url-instead", "empty-data"],
)
def test_image_generation_bad_payload(server: FakeServer, body: dict[str, Any]) -> None:
    server.script("/images/generations", Reply(body=body))

    with pytest.raises(PipelineError) as info:
        image_model(server).generate(IMAGE_CALL)

    assert info.value.code == BAD_RESPONSE
    assert_no_key(info.value)


def test_image_generation_retries_5xx(server: FakeServer) -> None:
    encoded = base64.b64encode(png_bytes()).decode()
    server.script(
        "/images/generations",
        Reply(502, b"bad gateway"),
        Reply(body={"data": [{"b64_json": encoded}]}),
    )

    assert image_model(server).generate(IMAGE_CALL).png == png_bytes()
    assert len(server.seen("/images/generations")) == 2


# --- pure helpers ------------------------------------------------------------------------


def test_parse_json_object_variants() -> None:
    assert parse_json_object('{"a": 1}') == {"a": 1}
    assert parse_json_object('```\n{"a": 2}\n```') == {"a": 2}
    assert parse_json_object('Sure! {"a": {"b": 3}} hope this helps') == {"a": {"b": 3}}
    assert parse_json_object("[1, 2]") is None
    assert parse_json_object("no braces at all") is None


def test_retry_after_and_backoff() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("nan") is None
    assert parse_retry_after("garbage") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    assert backoff_delay(0, base=1.0, cap=30.0) == 1.0
    assert backoff_delay(3, base=1.0, cap=30.0) == 8.0
    assert backoff_delay(10, base=1.0, cap=30.0) == 30.0
    assert backoff_delay(0, base=1.0, cap=30.0, retry_after=120.0) == 30.0
    assert backoff_delay(5, base=1.0, cap=30.0, retry_after=2.0) == 2.0
