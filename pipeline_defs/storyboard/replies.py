"""Checks on model replies: a step trusts no field a model returned until it is checked.

A malformed reply is the provider's fault (``provider.bad_response``), named with the task
and the field, so an operator sees which call misbehaved instead of a KeyError later.
"""

from collections.abc import Mapping
from typing import Any

from resources.providers import BAD_RESPONSE, TextReply
from resources.providers.base import provider_error


def reply_list(reply: TextReply | Mapping[str, Any], key: str, *, task: str) -> list[Any]:
    data = reply.data if isinstance(reply, TextReply) else reply
    value = data.get(key)
    if not isinstance(value, list):
        raise provider_error(BAD_RESPONSE, f"{task}: reply field {key!r} is not a list")
    return value


def reply_object(item: Any, *, task: str, where: str) -> Mapping[str, Any]:
    if not isinstance(item, Mapping):
        raise provider_error(BAD_RESPONSE, f"{task}: {where} is not an object")
    return item


def reply_text(item: Mapping[str, Any], key: str, *, task: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value.strip():
        raise provider_error(BAD_RESPONSE, f"{task}: {where}.{key} is missing or empty")
    return value.strip()


def reply_int(item: Mapping[str, Any], key: str, *, task: str, where: str) -> int:
    value = item.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise provider_error(BAD_RESPONSE, f"{task}: {where}.{key} is not an integer")
    return value
