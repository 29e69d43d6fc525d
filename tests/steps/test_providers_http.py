"""OpenAI-compatible providers (the official SDK) against a real local HTTP server."""

import base64
import io
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
from openai_server import CHAT, IMAGES, FakeOpenAI, Reply, chat_body, serving
from PIL import Image

from pipeline_defs.resume.errors import PipelineError
from resources.providers import (
    BAD_RESPONSE,
    CONFIG_ERROR,
    HTTP_ERROR,
    NO_KEY,
    RETRIES_EXHAUSTED,
    ImageCall,
    OpenAIImageModel,
    OpenAITextModel,
    TextCall,
    TextModel,
)
from resources.providers.openai_http import parse_json_object

API_KEY = "sk-test-DO-NOT-LEAK-1234567890"
KEY_ENV = "SB_TEST_PROVIDER_KEY"
CALL = TextCall(
    task="entity_canon", prompt="List the characters.", payload={"story": "Ann met Bo."}
)
# Fast retries: the SDK honours a server's retry-after-ms / Retry-After over its backoff.
SOON = {"retry-after-ms": "5"}


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    with serving() as fake:
        yield fake


def text_model(server: FakeOpenAI, **overrides: Any) -> OpenAITextModel:
    config: dict[str, Any] = {
        "base_url": server.base_url,
        "model": "gpt-test",
        "api_key_env": KEY_ENV,
        "timeout_seconds": 2.0,
        "max_retries": 2,
    }
    config.update(overrides)
    return OpenAITextModel(**config)


def chat(content: str, *, total_tokens: int | None = 42) -> dict[str, Any]:
    return chat_body(content, total_tokens=total_tokens)


def assert_no_key(err: BaseException) -> None:
    """The key must not surface in anything that reaches logs, metadata or checkpoints."""
    texts = [str(err), repr(err)]
    if isinstance(err, PipelineError):
        texts += [err.message, repr(err.details), repr(err.as_metadata())]
    cause = err.__cause__ or err.__context__
    while cause is not None:
        texts += [str(cause), repr(cause)]
        cause = cause.__cause__
    for text in texts:
        assert API_KEY not in text


def png_bytes(width: int = 8, height: int = 6) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


# --- text --------------------------------------------------------------------------------


def test_chat_completion_parsed_and_request_shape(server: FakeOpenAI) -> None:
    server.script(CHAT, Reply(body=chat('{"characters": [{"id": "C01"}]}')))

    reply = text_model(server).complete(CALL)

    assert reply.data == {"characters": [{"id": "C01"}]}
    assert reply.units == 42  # usage.total_tokens: the cost is real, not a count
    assert reply.model == "gpt-test-2024"
    (seen,) = server.seen(CHAT)
    assert seen.headers["authorization"] == f"Bearer {API_KEY}"
    assert seen.headers["content-type"] == "application/json"
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


def test_fenced_json_content_is_tolerated(server: FakeOpenAI) -> None:
    content = 'Here you go:\n```json\n{"scenes": [1, 2]}\n```\nAnything else?'
    server.script(CHAT, Reply(body=chat(content, total_tokens=None)))

    reply = text_model(server).complete(CALL)

    assert reply.data == {"scenes": [1, 2]}
    assert reply.units == 1  # no usage block → one unit per call


def test_non_json_content_is_bad_response(server: FakeOpenAI) -> None:
    server.script(CHAT, Reply(body=chat("Sorry, I cannot help with that.")))

    with pytest.raises(PipelineError) as info:
        text_model(server).complete(CALL)

    assert info.value.code == BAD_RESPONSE
    assert "no JSON object" in info.value.message
    assert len(server.seen(CHAT)) == 1  # a contract breach is not retried
    assert_no_key(info.value)


@pytest.mark.parametrize(
    "body",
    [
        b"<html>gateway page</html>",
        b'{"choices": [',
        {"choices": []},
        {"choices": [{"message": {"role": "assistant", "content": None}}]},
        chat('["a list", "not an object"]'),
    ],
    ids=["html-body", "truncated-json", "no-choices", "null-content", "json-array"],
)
def test_malformed_completion_is_bad_response(server: FakeOpenAI, body: Any) -> None:
    server.script(CHAT, Reply(body=body))

    with pytest.raises(PipelineError) as info:
        text_model(server).complete(CALL)

    assert info.value.code == BAD_RESPONSE
    assert len(server.seen(CHAT)) == 1
    assert_no_key(info.value)


def test_429_burst_with_retry_after_then_success(server: FakeOpenAI) -> None:
    server.script(
        CHAT,
        Reply(429, {"error": "slow down"}, {"Retry-After": "0.2"}),
        Reply(429, {"error": "slow down"}, {"Retry-After": "0.2"}),
        Reply(body=chat('{"ok": true}')),
    )

    started = time.monotonic()
    reply = text_model(server, max_retries=4).complete(CALL)

    assert reply.data == {"ok": True}
    assert len(server.seen(CHAT)) == 3
    assert time.monotonic() - started >= 0.4  # the server's Retry-After was honoured


def test_retry_after_beyond_the_sdk_cap_fails_at_once(server: FakeOpenAI) -> None:
    """A hostile Retry-After cannot park a worker: the SDK does not wait hours, it stops."""
    server.script(CHAT, Reply(429, b"later", {"Retry-After": "3600"}))

    started = time.monotonic()
    with pytest.raises(PipelineError) as info:
        text_model(server, max_retries=4).complete(CALL)

    assert info.value.code == RETRIES_EXHAUSTED
    assert info.value.details["http_status"] == 429
    assert len(server.seen(CHAT)) == 1
    assert time.monotonic() - started < 2.0


def test_500_forever_exhausts_retries(server: FakeOpenAI) -> None:
    server.script(CHAT, Reply(500, {"error": "boom"}, SOON))

    with pytest.raises(PipelineError) as info:
        text_model(server, max_retries=3).complete(CALL)

    assert info.value.code == RETRIES_EXHAUSTED
    assert len(server.seen(CHAT)) == 4
    assert "HTTP 500" in info.value.message and "max_retries=3" in info.value.message
    assert_no_key(info.value)


def test_400_is_http_error_immediately_and_redacted(server: FakeOpenAI) -> None:
    # A hostile/buggy endpoint echoing the credential must not leak it through our error.
    echo = {"error": {"message": f"bad request; you sent Authorization: Bearer {API_KEY}"}}
    server.script(CHAT, Reply(400, echo))

    with pytest.raises(PipelineError) as info:
        text_model(server, max_retries=4).complete(CALL)

    err = info.value
    assert err.code == HTTP_ERROR
    assert len(server.seen(CHAT)) == 1
    assert "400" in err.message and "bad request" in err.message
    assert err.details["http_status"] == 400
    assert_no_key(err)


def test_slow_server_times_out_then_retries_exhausted(server: FakeOpenAI) -> None:
    server.script(CHAT, Reply(body=chat('{"late": true}'), delay=0.6))

    with pytest.raises(PipelineError) as info:
        text_model(server, timeout_seconds=0.15, max_retries=1).complete(CALL)

    # The timeout, not the late answer, ended each attempt (no wall-clock bound: under a
    # loaded CI machine any such bound is a guess).
    assert info.value.code == RETRIES_EXHAUSTED
    assert "timed out" in info.value.message.lower()
    assert len(server.seen(CHAT)) == 2
    assert_no_key(info.value)


def test_connection_refused_exhausts_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, API_KEY)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAITextModel(
        base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key_env=KEY_ENV, max_retries=1
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


def test_api_key_with_control_characters_is_rejected_without_echo(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, API_KEY + "\r\nX-Evil: 1")
    with pytest.raises(PipelineError) as info:
        text_model(server).complete(CALL)

    assert info.value.code == CONFIG_ERROR
    assert_no_key(info.value)
    assert server.requests == []


def test_no_key_is_typed_and_sends_nothing(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    server.script(CHAT, Reply(body=chat('{"ok": true}')))

    with pytest.raises(PipelineError) as info:
        text_model(server).complete(CALL)

    assert info.value.code == NO_KEY
    assert KEY_ENV in info.value.message  # names the variable to set
    assert server.requests == []


def test_environment_key_wins_over_a_literal(server: FakeOpenAI) -> None:
    server.script(CHAT, Reply(body=chat('{"ok": true}')))

    text_model(server, api_key="sk-literal-from-yaml").complete(CALL)

    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_literal_key_is_the_fallback_and_read_per_request(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    server.script(CHAT, Reply(body=chat('{"ok": true}')))
    model = text_model(server, api_key="sk-literal-from-yaml")

    model.complete(CALL)
    monkeypatch.setenv(KEY_ENV, "sk-rotated")  # a rotated key applies without a rebuild
    model.complete(CALL)

    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer sk-literal-from-yaml",
        "Bearer sk-rotated",
    ]


def test_resource_repr_hides_api_key(server: FakeOpenAI) -> None:
    model = text_model(server, api_key=API_KEY)
    assert API_KEY not in repr(model)
    assert API_KEY not in str(model)


def test_key_env_resolved_inside_dagster_run(server: FakeOpenAI) -> None:
    server.script(CHAT, Reply(body=chat('{"characters": []}')))
    resource = OpenAITextModel(base_url=server.base_url, model="gpt-test", api_key_env=KEY_ENV)

    @dg.asset
    def entity_canon(text: TextModel) -> dict[str, Any]:
        return text.complete(CALL).data

    result = dg.materialize([entity_canon], resources={"text": resource})

    assert result.success
    assert result.output_for_node("entity_canon") == {"characters": []}
    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"


def test_dagster_env_var_literal_still_resolves(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.setenv("SB_OTHER_KEY", API_KEY)
    server.script(CHAT, Reply(body=chat('{"ok": true}')))

    text_model(server, api_key=dg.EnvVar("SB_OTHER_KEY")).complete(CALL)

    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"


# --- images ------------------------------------------------------------------------------


def image_model(server: FakeOpenAI, **overrides: Any) -> OpenAIImageModel:
    config: dict[str, Any] = {
        "base_url": server.base_url,
        "model": "img-test",
        "api_key_env": KEY_ENV,
        "max_retries": 1,
    }
    config.update(overrides)
    return OpenAIImageModel(**config)


IMAGE_CALL = ImageCall(prompt="a lighthouse", caption="S1", width=64, height=48, seed="abc")


def test_image_generation_returns_decoded_png(server: FakeOpenAI) -> None:
    png = png_bytes()
    encoded = base64.b64encode(png).decode()
    server.script(IMAGES, Reply(body={"created": 0, "data": [{"b64_json": encoded}]}))

    reply = image_model(server).generate(IMAGE_CALL)

    assert reply.png == png
    assert reply.units == 1
    assert reply.model == "img-test"
    (seen,) = server.seen(IMAGES)
    assert seen.headers["authorization"] == f"Bearer {API_KEY}"
    assert seen.body == {
        "model": "img-test",
        "prompt": "a lighthouse",
        "size": "64x48",
        "response_format": "b64_json",
        "n": 1,
    }


def test_image_usage_is_the_units(server: FakeOpenAI) -> None:
    encoded = base64.b64encode(png_bytes()).decode()
    usage = {"input_tokens": 5, "output_tokens": 70, "total_tokens": 75}
    server.script(
        IMAGES, Reply(body={"created": 0, "data": [{"b64_json": encoded}], "usage": usage})
    )

    assert image_model(server).generate(IMAGE_CALL).units == 75


@pytest.mark.parametrize(
    "body",
    [
        {"data": [{"b64_json": base64.b64encode(b"GIF89a not a png").decode()}]},
        {"data": [{"b64_json": "!!!not base64!!!"}]},
        {"data": [{"url": "https://cdn.example/img.png"}]},
        {"data": []},
        b"{not json",
    ],
    ids=["not-png", "bad-base64", "url-instead", "empty-data", "malformed-body"],
)
def test_image_generation_bad_payload(server: FakeOpenAI, body: Any) -> None:
    server.script(IMAGES, Reply(body=body))

    with pytest.raises(PipelineError) as info:
        image_model(server).generate(IMAGE_CALL)

    assert info.value.code == BAD_RESPONSE
    assert_no_key(info.value)


def test_image_generation_retries_5xx(server: FakeOpenAI) -> None:
    encoded = base64.b64encode(png_bytes()).decode()
    server.script(
        IMAGES,
        Reply(502, b"bad gateway", SOON),
        Reply(body={"created": 0, "data": [{"b64_json": encoded}]}),
    )

    assert image_model(server).generate(IMAGE_CALL).png == png_bytes()
    assert len(server.seen(IMAGES)) == 2


# --- pure helpers ------------------------------------------------------------------------


def test_parse_json_object_variants() -> None:
    assert parse_json_object('{"a": 1}') == {"a": 1}
    assert parse_json_object('```\n{"a": 2}\n```') == {"a": 2}
    assert parse_json_object('Sure! {"a": {"b": 3}} hope this helps') == {"a": {"b": 3}}
    assert parse_json_object("[1, 2]") is None
    assert parse_json_object("no braces at all") is None
