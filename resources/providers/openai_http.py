"""OpenAI-compatible HTTP providers using only the standard library.

Optional alternative to the offline generator (spec §8). Retries are bounded so a flaky
endpoint cannot stall a step forever, and every error text is scrubbed of the API key
because errors end up in Dagster event logs, ledger audit rows and checkpoints (spec §6).
"""

import base64
import binascii
import email.utils
import http.client
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import dagster as dg
from pydantic import Field

from .base import (
    BAD_RESPONSE,
    CONFIG_ERROR,
    HTTP_ERROR,
    INVALID_INPUT,
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

# 408/425/429 and 5xx are transient by HTTP semantics; any other non-2xx will not improve.
RETRYABLE_STATUSES = frozenset({408, 425, 429})
EXCERPT_CHARS = 200
_BEARER_RE = re.compile(r"(?i)(bearer\s+)[^\s\"',;]+")
_FENCE_RE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n?(.*?)```", re.DOTALL)
_MAX_OBJECT_SCANS = 32


def is_retryable_status(status: int) -> bool:
    """True for statuses where the same request may succeed later."""
    return status in RETRYABLE_STATUSES or 500 <= status <= 599


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds asked for by a ``Retry-After`` header (delta-seconds or HTTP-date), else None."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def backoff_delay(
    attempt: int, *, base: float, cap: float, retry_after: float | None = None
) -> float:
    """Delay before retry ``attempt`` (0-based): the server's wish if given, else exponential.

    Always capped so a hostile or buggy ``Retry-After`` cannot park a worker for hours.
    """
    wanted = retry_after if retry_after is not None else base * (2**attempt)
    return max(0.0, min(cap, wanted))


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


def _excerpt(raw: bytes) -> str:
    """Short single-line view of a response body for error messages."""
    text = " ".join(raw[: EXCERPT_CHARS * 4].decode("utf-8", errors="replace").split())
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1] + "…"


class OpenAIConnection(dg.ConfigurableResource):
    """Connection settings and the retrying JSON POST shared by the text and image providers."""

    base_url: str = Field(description="Endpoint root, e.g. https://api.openai.com/v1")
    model: str = Field(description="Model name sent with every request")
    api_key: str | None = Field(
        default=None,
        repr=False,
        description='Bearer token; pass dg.EnvVar("PIPELINE_PROVIDER_API_KEY"), never a literal',
    )
    timeout_seconds: float = Field(default=60, description="Socket timeout per attempt")
    max_retries: int = Field(default=4, description="Retries after the first attempt")
    backoff_seconds: float = Field(default=1.0, description="First retry delay; doubles each time")
    max_backoff_seconds: float = Field(
        default=30.0, description="Cap on any single delay, including Retry-After"
    )

    @property
    def model_name(self) -> str:
        """Configured model name (what the ledger records for this provider)."""
        return self.model

    def _sleep(self, seconds: float) -> None:
        """Wait between retries; a method so a test subclass can record instead of waiting."""
        time.sleep(seconds)

    def _api_key_value(self) -> str | None:
        """The key to send; resolves an unresolved ``EnvVar`` when used outside a Dagster run."""
        raw = self.api_key
        if isinstance(raw, dg.EnvVar):
            raw = raw.get_value()
        if raw is None:
            return None
        key = raw.strip()
        if not key:
            return None
        # http.client would echo an invalid header value verbatim in its ValueError.
        if any(ch.isspace() or not ch.isprintable() for ch in key):
            raise provider_error(CONFIG_ERROR, "api_key contains whitespace or control characters")
        return key

    def _redact(self, text: str, key: str | None) -> str:
        """Remove the key and any bearer token from text bound for logs and errors."""
        if key:
            text = text.replace(key, "***")
        return _BEARER_RE.sub(r"\1***", text)

    def _endpoint(self, path: str) -> str:
        """Validated ``{base_url}/{path}``; a bad config fails before any network traffic."""
        base = (self.base_url or "").strip().rstrip("/")
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
        if self.timeout_seconds <= 0 or self.max_retries < 0 or self.backoff_seconds < 0:
            raise provider_error(
                CONFIG_ERROR,
                "provider timeout_seconds must be > 0, max_retries and backoff_seconds >= 0",
            )
        return f"{base}/{path}"

    def _post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` and return the decoded JSON object, retrying transient failures."""
        url = self._endpoint(path)
        key = self._api_key_value()
        shown = self._redact(_safe_url(url), key)
        data = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "storyboard-pipeline",
        }
        if key:
            headers["Authorization"] = f"Bearer {key}"
        attempts = self.max_retries + 1
        last_error = ""
        last_exc: BaseException | None = None
        for attempt in range(attempts):
            retry_after: float | None = None
            request = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_seconds) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                try:
                    body_excerpt = self._redact(_excerpt(exc.read()), key)
                except (OSError, http.client.HTTPException):
                    body_excerpt = "<unreadable body>"
                finally:
                    exc.close()
                status = exc.code
                if not is_retryable_status(status):
                    raise provider_error(
                        HTTP_ERROR,
                        f"POST {shown} returned HTTP {status}: {body_excerpt}",
                        details={"http_status": status, "url": shown, "attempt": attempt + 1},
                    ) from None
                retry_after = parse_retry_after(exc.headers.get("Retry-After"))
                last_error = f"HTTP {status}: {body_excerpt}"
                last_exc = None
            except (OSError, http.client.HTTPException) as exc:
                # Timeouts, refused/reset connections, truncated responses: all transient.
                last_error = self._redact(f"{type(exc).__name__}: {exc}", key)
                last_exc = exc
            else:
                return self._decode_body(raw, shown, key)
            if attempt + 1 < attempts:
                self._sleep(
                    backoff_delay(
                        attempt,
                        base=self.backoff_seconds,
                        cap=self.max_backoff_seconds,
                        retry_after=retry_after,
                    )
                )
        error = provider_error(
            RETRIES_EXHAUSTED,
            f"POST {shown} failed after {attempts} attempts; last error: {last_error}",
            details={"url": shown, "attempts": attempts, "last_error": last_error},
        )
        if last_exc is None:
            raise error
        raise error from last_exc

    def _decode_body(self, raw: bytes, shown: str, key: str | None) -> dict[str, Any]:
        """Decode a 2xx body; anything but a JSON object is a contract breach, not transient."""
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            value = None
        if not isinstance(value, dict):
            raise provider_error(
                BAD_RESPONSE,
                f"POST {shown} answered a body that is not a JSON object: "
                f"{self._redact(_excerpt(raw), key)}",
                details={"url": shown},
            )
        return value


def _message_text(content: Any) -> str | None:
    """Text of ``message.content``: a string, or a list of text parts (some servers)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        ]
        return "".join(texts) if texts else None
    return None


class OpenAITextModel(OpenAIConnection, TextModel):
    """Chat-completions text model answering one JSON object per call."""

    def complete(self, call: TextCall) -> TextReply:
        """Ask ``/chat/completions`` for one JSON object and parse it into ``TextReply.data``."""
        try:
            payload_json = json.dumps(dict(call.payload), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise provider_error(
                INVALID_INPUT, f"payload of task {call.task!r} is not JSON-serializable: {exc}"
            ) from None
        body = {
            "model": self.model,
            "messages": [
                {
                    "role": "system",
                    "content": f"You are the {call.task} step of a storyboard pipeline. "
                    "Answer with one JSON object only.",
                },
                {"role": "user", "content": f"{call.prompt}\n\nINPUT:\n{payload_json}"},
            ],
            "response_format": {"type": "json_object"},
        }
        response = self._post_json("chat/completions", body)
        where = f"chat completion for task {call.task!r}"
        choices = response.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        message = first.get("message") if isinstance(first, dict) else None
        if not isinstance(message, dict):
            raise provider_error(BAD_RESPONSE, f"{where} has no choices[0].message")
        text = _message_text(message.get("content"))
        if text is None:
            refusal = message.get("refusal")
            reason = f"refusal: {_excerpt(str(refusal).encode())}" if refusal else "no content"
            raise provider_error(BAD_RESPONSE, f"{where} has {reason}")
        data = parse_json_object(text)
        if data is None:
            raise provider_error(
                BAD_RESPONSE,
                f"{where} contains no JSON object: {_excerpt(text.encode())}",
                details={"finish_reason": str(first.get("finish_reason")) if first else "None"},
            )
        usage = response.get("usage")
        tokens = usage.get("total_tokens") if isinstance(usage, dict) else None
        units = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0
        reported = response.get("model")
        return TextReply(
            data=data,
            units=units if units > 0 else 1,
            model=reported if isinstance(reported, str) and reported else self.model,
        )


class OpenAIImageModel(OpenAIConnection, ImageModel):
    """Images-generations model returning base64 PNGs."""

    def generate(self, call: ImageCall) -> ImageReply:
        """Ask ``/images/generations`` for one b64 PNG and verify it really is a PNG."""
        check_image_size(call)
        body = {
            "model": self.model,
            "prompt": call.prompt,
            "size": f"{call.width}x{call.height}",
            "response_format": "b64_json",
            "n": 1,
        }
        response = self._post_json("images/generations", body)
        items = response.get("data")
        first = items[0] if isinstance(items, list) and items else None
        encoded = first.get("b64_json") if isinstance(first, dict) else None
        if not isinstance(encoded, str) or not encoded:
            hint = " (got a url instead)" if isinstance(first, dict) and "url" in first else ""
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
        return ImageReply(png=png, units=1, model=self.model)
