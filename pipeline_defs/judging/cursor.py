"""The resume sensor's persisted cursor: what the last tick saw, and its text form.

The serialized form (keys, JSON shape, ``z1:`` compression) is the one sensors have stored
since ``CURSOR_VERSION`` 1, so a running sensor's cursor keeps loading. A field of the
wrong shape reads as absent (the tick then judges everything) rather than failing the
sensor.
"""

import base64
import hashlib
import json
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline_defs.judging.stores import ReadStores
from pipeline_defs.steps.spec import Step

CURSOR_VERSION = 1
_COMPRESS_ABOVE = 2048


@dataclass(frozen=True)
class CursorState:
    """What the last tick saw, persisted as the sensor's cursor (JSON, version ``v``).

    The serialized form (keys, JSON shape, ``z1:`` compression) is the one sensors have
    stored since ``CURSOR_VERSION`` 1, so a running sensor's cursor keeps loading.
    """

    scope: str | None = None  # scope_of(): a cursor of other stores/steps is not ours
    token: str | None = None  # ties the cursor to this process's memos
    ledger: tuple[int, str] | None = None  # LedgerStore.cursor() when it was taken
    parts: str | None = None  # digest of the partition keys
    tree: str | None = None  # digest of every partition's scan
    wake: float | None = None  # earliest epoch at which time alone changes a decision
    full_at: float | None = None  # epoch of the last full (or cold) judgement
    subdirs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    blocked: Mapping[str, str] = field(default_factory=dict)  # slot -> block signature
    pending: int = 0  # changed partitions left over (budget): the next tick is not idle

    def rescoped(self) -> "CursorState":
        """Other steps or stores: judge everything, but keep the block reports made."""
        return CursorState(blocked=self.blocked)

    def encode(self) -> str:
        state = {
            "v": CURSOR_VERSION,
            "scope": self.scope,
            "token": self.token,
            "ledger": list(self.ledger) if self.ledger is not None else None,
            "parts": self.parts,
            "tree": self.tree,
            "wake": self.wake,
            "full_at": self.full_at,
            "subdirs": {k: list(v) for k, v in sorted(self.subdirs.items()) if v},
            "blocked": dict(self.blocked),
            "pending": self.pending,
        }
        text = json.dumps(state, sort_keys=True, separators=(",", ":"))
        if len(text) <= _COMPRESS_ABOVE:
            return text
        return "z1:" + base64.b64encode(zlib.compress(text.encode("utf-8"), 6)).decode("ascii")

    @classmethod
    def decode(cls, text: str | None) -> "CursorState | None":
        """The cursor's state, or None for no / unreadable / other-version cursors.

        A field of the wrong shape reads as absent (the tick then judges everything)
        rather than failing the sensor.
        """
        if not text:
            return None
        try:
            if text.startswith("z1:"):
                text = zlib.decompress(base64.b64decode(text[3:])).decode("utf-8")
            state = json.loads(text)
        except (ValueError, zlib.error, UnicodeDecodeError):
            return None
        if not isinstance(state, dict) or state.get("v") != CURSOR_VERSION:
            return None
        raw_subdirs = state.get("subdirs")
        subdirs = {
            str(k): tuple(str(s) for s in v)
            for k, v in (raw_subdirs.items() if isinstance(raw_subdirs, dict) else ())
            if isinstance(v, list)
        }
        raw_blocked = state.get("blocked")
        return cls(
            scope=_str_or_none(state.get("scope")),
            token=_str_or_none(state.get("token")),
            ledger=_marker(state.get("ledger")),
            parts=_str_or_none(state.get("parts")),
            tree=_str_or_none(state.get("tree")),
            wake=_float_or_none(state.get("wake")),
            full_at=_float_or_none(state.get("full_at")),
            subdirs=subdirs,
            blocked=dict(raw_blocked) if isinstance(raw_blocked, dict) else {},
            pending=pending if isinstance(pending := state.get("pending"), int) else 0,
        )


def digest(parts: Iterable[str]) -> str:
    """A short, stable digest of strings (the cursor's ``parts`` and ``scope``)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def scope_of(steps: Sequence[Step], stores: ReadStores) -> str:
    """What a cursor belongs to: the data root, the ledger, the step graph and the spend
    cap. A changed cap moves no ledger row and no file, yet it changes verdicts (a step
    blocked at the cap may go on, docs/DESIGN.md#spend-cap): the next tick judges all."""
    return digest(
        [
            str(stores.checkpoints.home),
            stores.ledger.url,
            *(f"{s.step_id}:{s.schema_version}:{','.join(s.deps)}" for s in steps),
            f"max_calls_per_episode:{stores.settings.max_calls_per_episode}",
        ]
    )


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _float_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _marker(raw: object) -> tuple[int, str] | None:
    if not isinstance(raw, list) or len(raw) != 2:
        return None
    try:
        return int(raw[0]), str(raw[1])
    except (TypeError, ValueError):
        return None


def _loaded(text: str | None) -> dict[str, Any] | None:
    """The cursor's JSON object (``z1:`` undone), or None."""
    if not text:
        return None
    try:
        if text.startswith("z1:"):
            text = zlib.decompress(base64.b64decode(text[3:])).decode("utf-8")
        state = json.loads(text)
    except (ValueError, zlib.error, UnicodeDecodeError):
        return None
    return state if isinstance(state, dict) else None


def cursor_extra(text: str | None, name: str) -> Any:
    """A field the sensor keeps in its cursor beside the tick's own (the scrub's round);
    None when absent or unreadable. ``CursorState.decode`` ignores such fields."""
    state = _loaded(text)
    return None if state is None else state.get(name)


def with_cursor_extra(text: str, name: str, value: Any) -> str:
    """``text`` (a tick's cursor) with ``name`` set to ``value``, in the same text form."""
    state = _loaded(text)
    if state is None:
        return text
    state[name] = value
    out = json.dumps(state, sort_keys=True, separators=(",", ":"))
    if len(out) <= _COMPRESS_ABOVE:
        return out
    return "z1:" + base64.b64encode(zlib.compress(out.encode("utf-8"), 6)).decode("ascii")
