"""OpenAI-compatible providers on the official ``openai`` SDK.

The SDK owns the transport: ``base_url`` for any OpenAI-compatible endpoint, bounded
retries with backoff that honours ``Retry-After`` (408/409/429/5xx, timeouts, dropped
connections), the per-attempt ``timeout`` and typed errors. This module adds what the
pipeline needs around it: the key read from the environment at each request (never
stored in config, checkpoints or logs), a validation of the config before any traffic,
the SDK's errors mapped to our typed provider errors with every text scrubbed of the key
(errors reach Dagster event logs, ledger rows and checkpoints: docs/DESIGN.md#envelope), and token
usage as the billable ``units``.
"""

import base64
import binascii
import functools
import hashlib
import json
import os
import re
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from pipeline_defs.resume.money import Usage
from pipeline_defs.resume.settings_registry import SETTINGS

from .base import (
    BAD_RESPONSE,
    CONFIG_ERROR,
    HTTP_ERROR,
    INVALID_INPUT,
    NO_KEY,
    PNG_SIGNATURE,
    RETRIES_EXHAUSTED,
    ImageCall,
    ImageModel,
    ImageReply,
    TextCall,
    TextModel,
    TextReply,
    check_image_size,
    provider_error,
)
from .throttle import current_throttle, estimate_tokens, retry_after_seconds

if TYPE_CHECKING:
    import openai

DEFAULT_API_KEY_ENV = SETTINGS["provider_api_key"].var
# 408/409/429 and 5xx are what the SDK retries: failing on them means it gave up.
RETRYABLE_STATUSES = frozenset({408, 409, 429})
EXCERPT_CHARS = 200
_BEARER_RE = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")
_FENCE_RE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n?(.*?)```", re.DOTALL)
_MAX_OBJECT_SCANS = 32
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_retryable_status(status: int) -> bool:
    """True for statuses the SDK retries (the same request may succeed later)."""
    return status in RETRYABLE_STATUSES or 500 <= status <= 599


def parse_json_object(content: str) -> dict[str, Any] | None:
    """The JSON object in a model's answer: bare, inside a fenced block, or embedded in prose."""
    text = content.strip()
    candidates = [text, *(m.group(1).strip() for m in _FENCE_RE.finditer(text))]
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    decoder = json.JSONDecoder()
    start = text.find("{")
    scans = 0
    while start != -1 and scans < _MAX_OBJECT_SCANS:
        scans += 1
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def _safe_url(url: str) -> str:
    """URL without userinfo, query or fragment: those are where credentials tend to hide."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def _excerpt(text: str) -> str:
    """Short single-line view of a response body for error messages."""
    flat = " ".join(text[: EXCERPT_CHARS * 4].split())
    return flat if len(flat) <= EXCERPT_CHARS else flat[: EXCERPT_CHARS - 1] + "…"


def resolve_api_key(api_key_env: str, literal: str | None = None) -> str:
    """The key to send: the environment variable ``api_key_env``, else the literal.

    Read at each request, so a rotated key applies without a reload; refused typed
    (``provider.no_key``) when neither holds one, and when it could corrupt a header.
    """
    raw = os.environ.get(api_key_env) or literal
    key = (raw or "").strip()
    if not key:
        raise provider_error(
            NO_KEY,
            f"no API key: set the environment variable {api_key_env} "
            "(provider.api_key_env names it)",
            details={"api_key_env": api_key_env},
        )
    # A header value with a line break would smuggle headers; httpx would echo it.
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        raise provider_error(CONFIG_ERROR, "API key contains whitespace or control characters")
    return key


# One SDK client (and its connection pool) per endpoint, retry budget and key source,
# shared by every resource instance and run in the process. The key itself is not part
# of the client: a callable reads it per request.
_CLIENTS: dict[tuple[Any, ...], "openai.OpenAI"] = {}
_CLIENTS_LOCK = threading.Lock()


def _client_for(
    base_url: str, timeout: float, max_retries: int, api_key_env: str, literal: str | None
) -> "openai.OpenAI":
    import openai  # here, not at module import: the SDK costs ~0.6 s to load

    digest = hashlib.sha256(literal.encode()).hexdigest() if literal else None
    cache_key = (base_url, timeout, max_retries, api_key_env, digest)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(cache_key)
        if client is None:
            client = openai.OpenAI(
                api_key=functools.partial(resolve_api_key, api_key_env, literal),
                http_client=openai.DefaultHttpxClient(event_hooks={"response": [_hand_429_back]}),
                base_url=base_url,
                timeout=timeout,
                max_retries=max_retries,
                # Never pick up OPENAI_ORG_ID / OPENAI_PROJECT_ID meant for another tool.
                organization=None,
                project=None,
            )
            _CLIENTS[cache_key] = client
        return client


def _hand_429_back(response: Any) -> None:
    """A 429 met under a shared rate limit is the caller's to wait for, not the SDK's: it
    pauses every process's calls to the endpoint (docs/DESIGN.md#rate-limit), then asks
    again through the limit. Elsewhere the SDK retries it as before."""
    if response.status_code == 429 and current_throttle() is not None:
        response.headers["x-should-retry"] = "false"


class OpenAIConnection(dg.ConfigurableResource["OpenAIConnection"]):
    """Connection settings and the SDK call wrapper shared by the text and image providers."""

    base_url: str = Field(description="Endpoint root, e.g. https://api.openai.com/v1")
    model: str = Field(description="Model name sent with every request")
    api_key_env: str = Field(
        default=DEFAULT_API_KEY_ENV,
        description="Environment variable holding the API key, read at each request",
    )
    api_key: str | None = Field(
        default=None,
        repr=False,
        description="Fallback key when api_key_env is unset; prefer the environment",
    )
    timeout_seconds: float = Field(default=60, description="Timeout per attempt")
    max_retries: int = Field(default=4, description="Retries after the first attempt")

    @property
    def model_name(self) -> str:
        """Configured model name (what the ledger records for this provider)."""
        return self.model

    def _literal_key(self) -> str | None:
        raw: Any = self.api_key
        if isinstance(raw, dg.EnvVar):  # unresolved outside a Dagster run
            raw = raw.get_value()
        return raw if isinstance(raw, str) else None

    def preflight(self) -> None:
        """Config and key present and well-formed; raises typed, before any network traffic."""
        base = (self.base_url or "").strip()
        if not base:
            raise provider_error(CONFIG_ERROR, "provider base_url is empty")
        if not (self.model or "").strip():
            raise provider_error(CONFIG_ERROR, "provider model is empty")
        parts = urllib.parse.urlsplit(base)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise provider_error(
                CONFIG_ERROR,
                f"provider base_url must be an http(s) URL, got {_safe_url(base)!r}",
            )
        if self.timeout_seconds <= 0 or self.max_retries < 0:
            raise provider_error(
                CONFIG_ERROR, "provider timeout_seconds must be > 0 and max_retries >= 0"
            )
        if not _ENV_NAME_RE.match(self.api_key_env or ""):
            raise provider_error(
                CONFIG_ERROR, f"provider api_key_env {self.api_key_env!r} is not a variable name"
            )
        resolve_api_key(self.api_key_env, self._literal_key())

    def _client(self) -> "openai.OpenAI":
        self.preflight()
        return _client_for(
            self.base_url.strip().rstrip("/"),
            float(self.timeout_seconds),
            int(self.max_retries),
            self.api_key_env,
            self._literal_key(),
        )

    def _redact(self, text: str) -> str:
        """Remove the key and any bearer token from text bound for logs and errors."""
        for key in (os.environ.get(self.api_key_env), self._literal_key()):
            if key and key.strip():
                text = text.replace(key.strip(), "***")
        return _BEARER_RE.sub(r"\1***", text)

    def _where(self, path: str) -> str:
        return f"POST {_safe_url(self.base_url.strip().rstrip('/') + '/' + path)}"

    def _mapped(self, exc: Exception, path: str) -> Exception:
        """The SDK's (or the decoder's) error as our typed provider error, key scrubbed."""
        import openai  # loaded already: a client exists whenever an SDK error does

        where = self._where(path)
        budget = f"max_retries={self.max_retries}"
        if isinstance(exc, openai.APITimeoutError):
            return provider_error(
                RETRIES_EXHAUSTED,
                f"{where} timed out after {self.timeout_seconds}s per attempt; gave up ({budget})",
                details={"url": where, "max_retries": self.max_retries},
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__ or exc
            text = self._redact(f"{type(cause).__name__}: {cause}")
            return provider_error(
                RETRIES_EXHAUSTED,
                f"{where} could not connect; gave up ({budget}); last error: {text}",
                details={"url": where, "max_retries": self.max_retries},
            )
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            body = self._redact(_excerpt(_body_text(exc)))
            details = {"url": where, "http_status": status}
            if is_retryable_status(status):
                return provider_error(
                    RETRIES_EXHAUSTED,
                    f"{where} returned HTTP {status}; gave up ({budget}): {body}",
                    details={**details, "max_retries": self.max_retries},
                )
            return provider_error(
                HTTP_ERROR, f"{where} returned HTTP {status}: {body}", details=details
            )
        if isinstance(exc, openai.APIResponseValidationError | ValueError):
            return provider_error(
                BAD_RESPONSE,
                f"{where} answered a body that is not the expected JSON: "
                f"{self._redact(_excerpt(str(exc)))}",
                details={"url": where},
            )
        return provider_error(
            HTTP_ERROR,
            f"{where} failed: {type(exc).__name__}: {self._redact(_excerpt(str(exc)))}",
            details={"url": where},
        )

    def _call(self, path: str, send: Any, tokens: int = 0) -> Any:
        """Run one SDK request; every failure leaves as a typed, scrubbed provider error.

        Under a shared rate limit (the metered call's throttle) the request waits for its
        slot first, and a 429 pauses every process's calls to the endpoint before it is
        asked again, at most ``max_retries`` times (docs/DESIGN.md#rate-limit)."""
        import openai  # loaded already by ``_client``

        client = self._client()
        throttle = current_throttle()
        endpoint = _safe_url(self.base_url.strip().rstrip("/"))
        limited = 0
        while True:
            if throttle is not None:
                throttle.before_send(endpoint, self.model, tokens)
            try:
                response = send(client)
            except openai.APIStatusError as exc:
                if throttle is not None and exc.status_code == 429:
                    wait = retry_after_seconds(exc.response.headers)
                    throttle.rate_limited(endpoint, self.model, wait)
                    limited += 1
                    if limited <= self.max_retries:
                        continue
                error = self._mapped(exc, path)
                break
            # ValueError: a 2xx JSON content type whose body is not JSON.
            except (openai.OpenAIError, ValueError) as exc:
                error = self._mapped(exc, path)
                break
            used = _field(_field(response, "usage"), "total_tokens")
            if throttle is not None and tokens and isinstance(used, int) and used > 0:
                throttle.settle(endpoint, self.model, tokens, used)
            return response
        # Raised outside the handler: not even ``__context__`` keeps the SDK's exception,
        # whose text may quote the request (and an echoing server, the key).
        raise error


def _body_text(exc: "openai.APIStatusError") -> str:
    try:
        return exc.response.text
    except Exception:  # a body we cannot read says nothing more than its status
        return "<unreadable body>"


def _field(value: Any, name: str) -> Any:
    """``value.name`` for SDK models and plain dicts alike (a lax parse keeps dicts)."""
    if isinstance(value, dict):
        return value.get(name)
    return getattr(value, name, None)


def _message_text(content: Any) -> str | None:
    """Text of ``message.content``: a string, or a list of text parts (some servers)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [t for t in (_field(part, "text") for part in content) if isinstance(t, str)]
        return "".join(texts) if texts else None
    return None


def _count(value: Any) -> int:
    """A reported token count, else 0 (absent, null, or not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def reported_usage(response: Any, *, images: int = 0) -> Usage | None:
    """Usage as the endpoint reports it: chat completions' ``prompt_tokens``,
    ``completion_tokens`` and ``prompt_tokens_details.cached_tokens``, the images API's
    ``input_tokens``/``output_tokens`` (and ``input_tokens_details.cached_tokens``). None for
    a text reply that reports none; an image reply is always one image."""
    usage = _field(response, "usage")
    if usage is None and not images:
        return None
    prompt = _count(_field(usage, "prompt_tokens")) or _count(_field(usage, "input_tokens"))
    details = _field(usage, "prompt_tokens_details") or _field(usage, "input_tokens_details")
    output = _count(_field(usage, "completion_tokens")) or _count(_field(usage, "output_tokens"))
    if not (prompt or output or images):
        return None
    return Usage(
        input_tokens=prompt,
        output_tokens=output,
        cached_input_tokens=min(_count(_field(details, "cached_tokens")), prompt),
        images=images,
    )


def _usage_units(response: Any) -> int:
    """Billable units of a reply: its reported ``usage.total_tokens``, else one per call."""
    tokens = _field(_field(response, "usage"), "total_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        return tokens
    return 1


def _output_limit(call: TextCall) -> dict[str, int]:
    """The output limit a call is sent with, if it has one (the worst case a money budget
    reserves): ``max_completion_tokens``, the chat API's name for it."""
    if call.max_output_tokens is None:
        return {}
    return {"max_completion_tokens": call.max_output_tokens}


class OpenAITextModel(OpenAIConnection, TextModel):
    """Chat-completions text model answering one JSON object per call."""

    def complete(self, call: TextCall) -> TextReply:
        """Ask ``chat/completions`` for one JSON object and parse it into ``TextReply.data``."""
        try:
            payload_json = json.dumps(dict(call.payload), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise provider_error(
                INVALID_INPUT, f"payload of task {call.task!r} is not JSON-serializable: {exc}"
            ) from None
        messages = [
            {
                "role": "system",
                "content": f"You are the {call.task} step of a storyboard pipeline. "
                "Answer with one JSON object only.",
            },
            {"role": "user", "content": f"{call.prompt}\n\nINPUT:\n{payload_json}"},
        ]
        response = self._call(
            "chat/completions",
            lambda client: client.chat.completions.create(
                model=self.model,
                messages=messages,
                response_format={"type": "json_object"},
                **_output_limit(call),
            ),
            tokens=estimate_tokens(messages[0]["content"] + messages[1]["content"]),
        )
        where = f"chat completion for task {call.task!r}"
        if isinstance(response, str):  # the SDK hands back a non-JSON body as text
            raise provider_error(
                BAD_RESPONSE, f"{where} is not JSON: {self._redact(_excerpt(response))}"
            )
        choices = _field(response, "choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        message = _field(first, "message")
        if message is None:
            raise provider_error(BAD_RESPONSE, f"{where} has no choices[0].message")
        text = _message_text(_field(message, "content"))
        if text is None:
            refusal = _field(message, "refusal")
            reason = f"refusal: {_excerpt(str(refusal))}" if refusal else "no content"
            raise provider_error(BAD_RESPONSE, f"{where} has {self._redact(reason)}")
        data = parse_json_object(text)
        if data is None:
            raise provider_error(
                BAD_RESPONSE,
                f"{where} contains no JSON object: {self._redact(_excerpt(text))}",
                details={"finish_reason": str(_field(first, "finish_reason"))},
            )
        reported = _field(response, "model")
        return TextReply(
            data=data,
            units=_usage_units(response),
            model=reported if isinstance(reported, str) and reported else self.model,
            usage=reported_usage(response),
        )


class OpenAIImageModel(OpenAIConnection, ImageModel):
    """Images-generations model returning base64 PNGs."""

    def generate(self, call: ImageCall) -> ImageReply:
        """Ask ``images/generations`` for one b64 PNG and verify it really is a PNG."""
        check_image_size(call)
        response = self._call(
            "images/generations",
            lambda client: client.images.generate(
                model=self.model,
                prompt=call.prompt,
                size=f"{call.width}x{call.height}",  # any size the server accepts
                response_format="b64_json",
                n=1,
            ),
        )
        if isinstance(response, str):
            raise provider_error(
                BAD_RESPONSE, f"image generation is not JSON: {self._redact(_excerpt(response))}"
            )
        items = _field(response, "data")
        first = items[0] if isinstance(items, list) and items else None
        encoded = _field(first, "b64_json")
        if not isinstance(encoded, str) or not encoded:
            hint = " (got a url instead)" if _field(first, "url") else ""
            raise provider_error(BAD_RESPONSE, f"image generation has no data[0].b64_json{hint}")
        try:
            png = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise provider_error(
                BAD_RESPONSE, "image generation data[0].b64_json is not valid base64"
            ) from None
        if not png.startswith(PNG_SIGNATURE):
            raise provider_error(
                BAD_RESPONSE,
                f"image generation returned {len(png)} bytes without a PNG signature",
            )
        return ImageReply(
            png=png,
            units=_usage_units(response),
            model=self.model,
            usage=reported_usage(response, images=1),
        )
