"""The checkpoint envelope: a step's persisted output for one partition, plus provenance."""

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.decision_types import CheckpointSummary
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus

SECRET_MARKERS = ("api_key", "password", "secret", "token", "credential")
MASK = "***"

REQUIRED_FIELDS = (
    "step_id",
    "project_id",
    "episode_id",
    "status",
    "schema_version",
    "config_hash",
    "resume_config_keys",
    "project_config_snapshot",
    "data",
    "artifacts",
    "produced_by",
    "created_at",
    "mutations",
    # Mandatory (docs/DESIGN.md#no-escape): without it an edited file would load as clean and SKIP.
    "content_hash",
)

# A field of the wrong JSON shape: a contract breach of the file, not a crash of its reader.
CODE_INVALID = "checkpoint.invalid"
TEXT_FIELDS = ("step_id", "project_id", "episode_id", "status", "config_hash", "created_at")
OBJECT_FIELDS = ("project_config_snapshot", "data", "produced_by")
ARTIFACTS_SHAPE = "a list of objects with a string 'path', a string 'sha256' and an integer 'bytes'"
# How a content hash that does not match reads; operator views key "storyboard accept" on it.
EDITED_OUTSIDE = "edited outside the pipeline"
SHOWN_CHARS = 120  # how much of a wrong value an error message quotes
# An envelope's status is the exact text of a StepStatus (its content hash covers the text).
_STATUSES: dict[str, StepStatus] = {s.value: s for s in StepStatus}


def canonical_json(value: Any) -> str:
    """Stable text for hashing: sorted keys, no whitespace, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_secret_key(key: str) -> bool:
    # Separators are dropped so that apiKey, api-key and x-api-key match "api_key" too.
    squashed = key.lower().replace("-", "").replace("_", "")
    return any(marker.replace("_", "") in squashed for marker in SECRET_MARKERS)


# URL query parameters that carry a credential although their name holds no marker.
URL_SECRET_PARAMS = frozenset({"key", "apikey", "sig", "signature", "auth", "pwd", "passwd"})


def _is_secret_param(name: str) -> bool:
    plain = unquote_plus(name)
    squashed = plain.lower().replace("-", "").replace("_", "")
    return is_secret_key(plain) or squashed in URL_SECRET_PARAMS


def _mask_url(text: str) -> str:
    """``text`` with a URL's userinfo and secret-looking query values replaced by ``***``.

    A key in ``https://user:KEY@host/v1`` or ``…/v1?api_key=KEY`` sits under a key such as
    ``base_url`` that names no secret, so masking by key name alone stored it in plain text.
    Everything else (scheme, host, path, other parameters) stays readable.
    """
    if "://" not in text or ("@" not in text and "=" not in text):
        return text  # the common config string: nowhere for a URL to hold a credential
    try:
        parts = urlsplit(text)
    except ValueError:  # URL-like but unparseable (a broken IPv6 host): hide, don't guess
        return MASK
    if not parts.scheme or not parts.netloc:
        return text
    netloc = f"{MASK}@{parts.netloc.rpartition('@')[2]}" if "@" in parts.netloc else parts.netloc
    query = "&".join(
        f"{name}={MASK}" if value and _is_secret_param(name) else f"{name}{sep}{value}"
        for name, sep, value in (param.partition("=") for param in parts.query.split("&"))
    )
    if (netloc, query) == (parts.netloc, parts.query):
        return text  # unchanged URLs keep their exact text
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def mask_secrets(value: Any) -> Any:
    """Copy of ``value`` with every secret-looking key's value replaced, at any depth, and
    credentials inside URL strings (userinfo, secret query parameters) masked."""
    if isinstance(value, Mapping):
        return {
            str(k): (MASK if is_secret_key(str(k)) and v not in (None, "") else mask_secrets(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [mask_secrets(v) for v in value]
    if isinstance(value, str):
        return _mask_url(value)
    return value


def _shown(value: Any) -> str:
    """``repr`` of a wrong value, cut short: a tampered ``data`` may be megabytes."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 1] + "…"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not 1


def _is_list(value: Any) -> bool:
    # A string is iterable but never a list here: tuple("style") would be 5 keys.
    return isinstance(value, list | tuple)


def _is_text_list(value: Any) -> bool:
    return _is_list(value) and all(isinstance(v, str) for v in value)


def _is_text_mapping(value: Any) -> bool:
    return isinstance(value, Mapping) and all(isinstance(v, str) for v in value.values())


def _is_artifact(value: Any) -> bool:
    return (
        isinstance(value, Mapping)
        and isinstance(value.get("path"), str)
        and isinstance(value.get("sha256"), str)
        and _is_int(value.get("bytes"))
    )


@dataclass(frozen=True)
class Artifact:
    """A file a step produced, relative to its step directory, with its content hash."""

    path: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class Checkpoint:
    """Envelope (docs/DESIGN.md#envelope). ``content_hash`` (the DataVersion) ignores provenance."""

    step_id: str
    project_id: str
    episode_id: str
    status: StepStatus
    schema_version: int
    config_hash: str
    resume_config_keys: tuple[str, ...]
    config_fingerprints: Mapping[str, str]
    project_config_snapshot: Mapping[str, Any]
    data: Mapping[str, Any]
    artifacts: tuple[Artifact, ...] = ()
    produced_by: Mapping[str, Any] = field(default_factory=dict)
    created_at: str = ""
    mutations: tuple[Mapping[str, Any], ...] = ()

    @property
    def key(self) -> StepKey:
        return StepKey(self.project_id, self.episode_id, self.step_id)

    @property
    def run_id(self) -> str | None:
        value = self.produced_by.get("run_id")
        return str(value) if value is not None else None

    @property
    def version(self) -> str:
        """Which version of this step's envelope: a rewrite or an in-place mutation changes it."""
        return f"{self.created_at}|{self.run_id}|{len(self.mutations)}"

    @property
    def content_hash(self) -> str:
        """Hash of what downstream consumes: schema, status, data and artifact contents."""
        return sha256_text(
            canonical_json(
                {
                    "schema_version": self.schema_version,
                    "status": self.status.value,
                    "data": self.data,
                    "artifacts": [asdict(a) for a in self.artifacts],
                }
            )
        )

    @property
    def identity_hash(self) -> str:
        """Everything but provenance: equal identity means a rewrite would change nothing."""
        return sha256_text(
            canonical_json(
                {
                    "content": self.content_hash,
                    "config_hash": self.config_hash,
                    "config_fingerprints": dict(self.config_fingerprints),
                    "mutations": list(self.mutations),
                }
            )
        )

    def summary(self) -> CheckpointSummary:
        return CheckpointSummary(
            present=True,
            schema_version=self.schema_version,
            status=self.status,
            config_hash=self.config_hash,
            config_fingerprints=dict(self.config_fingerprints),
        )

    def artifact(self, path: str) -> Artifact | None:
        return next((a for a in self.artifacts if a.path == path), None)

    def with_changes(self, **changes: Any) -> "Checkpoint":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "project_id": self.project_id,
            "episode_id": self.episode_id,
            "status": self.status.value,  # the file holds the text
            "schema_version": self.schema_version,
            "config_hash": self.config_hash,
            "resume_config_keys": list(self.resume_config_keys),
            "config_fingerprints": dict(self.config_fingerprints),
            "project_config_snapshot": mask_secrets(self.project_config_snapshot),
            "data": self.data,
            "artifacts": [asdict(a) for a in self.artifacts],
            "produced_by": dict(self.produced_by),
            "created_at": self.created_at,
            "mutations": list(self.mutations),
            "content_hash": self.content_hash,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, raw: Any, *, source: str, edited: bool = False) -> "Checkpoint":
        """Parse an envelope, raising a typed integrity error that names ``source``.

        Every field's JSON shape is checked before anything is built from it, so a tampered
        or foreign file is a ``PipelineError`` (contract drift, naming file and field) and
        never a bare TypeError from deep inside the judge, the sensor or a force.
        """

        def broken(problem: str) -> PipelineError:
            return PipelineError(
                ErrorCode.IO_INTEGRITY_VIOLATION,
                f"checkpoint {source}: {problem}",
                origin=Origin.CONTRACT_DRIFT.value,
                details={"path": source},
            )

        def invalid(name: str, expected: str, value: Any) -> PipelineError:
            return PipelineError(
                CODE_INVALID,
                f"checkpoint {source}: field {name!r} must be {expected}, got {_shown(value)}",
                origin=Origin.CONTRACT_DRIFT.value,
                details={"path": source, "field": name},
            )

        if not isinstance(raw, Mapping):
            raise broken("envelope is not a JSON object")
        absent = [name for name in REQUIRED_FIELDS if name not in raw]
        if absent:
            raise broken(f"envelope is missing fields {absent}")
        if not isinstance(raw["schema_version"], int) or isinstance(raw["schema_version"], bool):
            raise broken(f"schema_version {raw['schema_version']!r} is not an integer")
        for name in (*TEXT_FIELDS, "content_hash"):
            if not isinstance(raw[name], str):
                raise invalid(name, "a string", raw[name])
        if not _is_text_list(raw["resume_config_keys"]):
            raise invalid("resume_config_keys", "a list of strings", raw["resume_config_keys"])
        # Optional: envelopes written before config fingerprints existed have none.
        fingerprints = raw.get("config_fingerprints")
        if fingerprints is None:
            fingerprints = {}
        if not _is_text_mapping(fingerprints):
            raise invalid("config_fingerprints", "an object of strings", fingerprints)
        for name in OBJECT_FIELDS:
            if not isinstance(raw[name], Mapping):
                raise invalid(name, "an object", raw[name])
        status = _STATUSES.get(raw["status"])
        if status is None:
            raise invalid("status", f"one of {sorted(_STATUSES)}", raw["status"])
        if not _is_list(raw["artifacts"]):
            raise invalid("artifacts", ARTIFACTS_SHAPE, raw["artifacts"])
        for entry in raw["artifacts"]:
            if not _is_artifact(entry):
                raise invalid("artifacts", ARTIFACTS_SHAPE, entry)
        if not _is_list(raw["mutations"]) or not all(
            isinstance(m, Mapping) for m in raw["mutations"]
        ):
            raise invalid("mutations", "a list of objects", raw["mutations"])
        checkpoint = cls(
            step_id=raw["step_id"],
            project_id=raw["project_id"],
            episode_id=raw["episode_id"],
            status=status,
            schema_version=raw["schema_version"],
            config_hash=raw["config_hash"],
            resume_config_keys=tuple(raw["resume_config_keys"]),
            config_fingerprints=dict(fingerprints),
            project_config_snapshot=dict(raw["project_config_snapshot"]),
            data=dict(raw["data"]),
            artifacts=tuple(
                Artifact(path=a["path"], sha256=a["sha256"], bytes=a["bytes"])
                for a in raw["artifacts"]
            ),
            produced_by=dict(raw["produced_by"]),
            created_at=raw["created_at"],
            mutations=tuple(dict(m) for m in raw["mutations"]),
        )
        stored = raw["content_hash"]
        # ``edited``: an operator's hand edit being accepted (``storyboard accept``): its
        # content hash is recomputed, not trusted, once the step has validated the edit.
        if stored != checkpoint.content_hash and not edited:
            raise PipelineError(
                ErrorCode.IO_INTEGRITY_VIOLATION,
                f"checkpoint {source}: content hash {stored} does not match the content "
                f"({checkpoint.content_hash}); the file was {EDITED_OUTSIDE}",
                origin=Origin.INVARIANT_DRIFT.value,
                details={"path": source},
            )
        return checkpoint
