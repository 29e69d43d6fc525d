"""Deterministic offline text model: the default text provider (docs/DESIGN.md#reference-pipeline).

It answers each step's request (``TextCall.task``) with the answer that step declared
beside itself (``Step.offline_replies``, registered in :data:`OFFLINE_REPLIES`): JSON built
from the payload alone. The same call always gives the same answer, so a re-run with the
same inputs writes byte-identical checkpoints. No network, no wall clock, no global
randomness. The storyboard's answers and what they share: ``pipeline_defs/storyboard``
(``offline_language.py``).
"""

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import Field

from pipeline_defs.resume.money import Usage
from pipeline_defs.resume.settings import MAX_OFFLINE_LATENCY_MS

from .base import (
    CONFIG_ERROR,
    INVALID_INPUT,
    TextCall,
    TextModel,
    TextReply,
    provider_error,
    simulated_latency_ms,
)

OFFLINE_TEXT_MODEL = "offline-text-v1"

# What the offline model answers to one task: JSON built from the request's payload alone.
OfflineReply = Callable[[Mapping[str, Any]], dict[str, Any]]


class OfflineReplies:
    """The offline model's answers, by ``TextCall.task``: each step that sends a task
    declares its answer beside itself (``Step.offline_replies``), which registers it here
    when the step's class is defined."""

    def __init__(self) -> None:
        self._replies: dict[str, OfflineReply] = {}
        self._lock = threading.Lock()

    def register(self, task: str, reply: OfflineReply) -> None:
        """Answer ``task`` with ``reply``; a second, different answer to one task is refused
        (two steps sending one task would get each other's answers)."""
        with self._lock:
            known = self._replies.get(task)
            if known is not None and _name(known) != _name(reply):
                raise provider_error(
                    CONFIG_ERROR,
                    f"offline text model: task {task!r} is answered by {_name(known)} "
                    f"already, not also by {_name(reply)}",
                )
            self._replies[task] = reply

    def get(self, task: str) -> OfflineReply | None:
        return self._replies.get(task)

    def tasks(self) -> list[str]:
        return sorted(self._replies)


def _name(reply: OfflineReply) -> str:
    """Where a reply is defined: the same function again (a module imported afresh) is no
    rival answer."""
    return f"{reply.__module__}.{reply.__qualname__}"


OFFLINE_REPLIES = OfflineReplies()


class OfflineTextModel(TextModel):
    """Deterministic text 'model': same call, same JSON; no network, clock or global RNG."""

    latency_ms: int | None = Field(
        default=None,
        ge=0,
        le=MAX_OFFLINE_LATENCY_MS,  # the bound PIPELINE_OFFLINE_LATENCY_MS has in the settings
        description="Simulated latency per call; None = PIPELINE_OFFLINE_LATENCY_MS at call time",
    )

    @property
    def model_name(self) -> str:
        return OFFLINE_TEXT_MODEL

    def complete(self, call: TextCall) -> TextReply:
        """Dispatch on ``call.task``; an unknown task is a configuration error, not a guess."""
        handler = OFFLINE_REPLIES.get(call.task)
        if handler is None:
            raise provider_error(
                CONFIG_ERROR,
                f"offline text model has no handler for task {call.task!r} "
                f"(known: {', '.join(OFFLINE_REPLIES.tasks())})",
            )
        try:
            data = handler(call.payload)
        except (KeyError, TypeError, ValueError) as exc:
            raise provider_error(
                INVALID_INPUT,
                f"offline text model: malformed payload for task {call.task!r}: "
                f"{type(exc).__name__}: {exc}",
            ) from None
        # Rough token count, deterministic, so the cost ledger has something to add up.
        size = len(call.prompt) + len(json.dumps(dict(call.payload), default=str))
        answer = len(json.dumps(data))
        units = max(1, (size + answer) // 4)
        # Deterministic usage in the same rough tokens, split as an endpoint reports it.
        usage = Usage(input_tokens=size // 4, output_tokens=units - size // 4)
        delay = simulated_latency_ms(self.latency_ms)
        if delay > 0:
            time.sleep(delay / 1000)
        return TextReply(data=data, units=units, model=OFFLINE_TEXT_MODEL, usage=usage)
