"""One typed error for the whole project: a stable ``code``, a message, an HTTP-like status."""

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, ClassVar, Self


class Code(StrEnum):
    """A family of stable error codes, each member its code's text with an HTTP-like status.

    The value is the code's text (what JSON output, metadata and tests compare); ``status``
    is what a ``PipelineError`` of that code carries unless the raiser says otherwise.
    409 = a conflict with another owner or a block; 4xx a fault of the input, config or
    checkpoint; 5xx a fault of the upstream provider, the storage or our own code.
    The protocol's own codes are :class:`ErrorCode`; a pipeline's step declares its own
    family beside the step (``class StorySourceCode(Code)`` in its module), and
    :func:`status_of` knows every family. ``tests/core/test_codes.py`` scans the product
    code: every code raised is a member of a family.
    """

    status: int

    def __new__(cls, code: str, status: int) -> "Code":
        member = str.__new__(cls, code)
        member._value_ = code
        member.status = status
        return member


class ErrorCode(Code):
    """Every stable code the run protocol, the judge and the adapters raise."""

    # The run protocol and the judge.
    STEP_ALREADY_RUNNING = "step.already_running", 409
    STEP_RESUME_BLOCKED = "step.resume_blocked", 409
    STEP_OWNERSHIP_LOST = "step.ownership_lost", 409
    STEP_RECOVERY_EXHAUSTED = "step.recovery_exhausted", 409
    STEP_GATE_BLOCKED = "step.gate_blocked", 409
    STEP_VERIFY_CRASHED = "step.verify_crashed", 500
    STEP_EXECUTE_FAILED = "step.execute_failed", 500
    STEP_VICTIM_RUNNING = "step.victim_running", 409
    STEP_VICTIM_NOT_SETTLED = "step.victim_not_settled", 409
    STEP_MUTATION_REJECTED = "step.mutation_rejected", 422
    STEP_PROVIDER_OUTSIDE_RUN = "step.provider_outside_run", 500
    STEP_RESET_REFUSED = "step.reset_refused", 409
    MUTATION_VICTIM_CHANGED = "mutation.victim_changed", 409
    # The episode's provider calls reached its cap (max_calls_per_episode): nothing more is
    # sent until an operator raises it (docs/DESIGN.md#spend-cap).
    BUDGET_EXHAUSTED = "budget.exhausted", 409
    # ``add-episode``: the story's estimated calls are over the episode's cap.
    BUDGET_OVER_CAP = "budget.over_cap", 400
    # ``storyboard accept``: a hand edit the step cannot make valid, or nothing to accept.
    ACCEPT_REFUSED = "accept.refused", 422
    ACCEPT_NOTHING = "accept.nothing_published", 409
    REDRAW_INVALID = "redraw.invalid", 400
    REDRAW_UNKNOWN_ITEM = "redraw.unknown_item", 400
    REDRAW_UNSUPPORTED = "redraw.unsupported", 400
    # Checkpoints and their files.
    IO_INTEGRITY_VIOLATION = "io.integrity_violation", 422
    IO_CHECKPOINT_MISSING = "io.checkpoint_missing", 404
    CHECKPOINT_INVALID = "checkpoint.invalid", 422  # a checkpoint.json field of the wrong shape
    # A link where a file or directory of ours should be (docs/DESIGN.md#no-escape): a conflict with
    # whoever planted it, resolved by hand; the link is never followed nor removed.
    CHECKPOINT_SYMLINK = "checkpoint.symlink", 409
    # Input, configuration, operator commands.
    SETTINGS_INVALID = "settings.invalid", 400
    INPUT_INVALID_ID = "input.invalid_id", 400
    INPUT_INVALID = "input.invalid", 400
    INPUT_STORY_EXISTS = "input.story_exists", 409
    CONFIG_INVALID = "config.invalid", 400
    # A money budget is set but a model of the project has no price (docs/DESIGN.md#money-budgets).
    CONFIG_UNPRICED_MODEL = "config.unpriced_model", 400
    CONFIG_DAGSTER_HOME = "config.dagster_home", 400
    # The Dagster instance's PostgreSQL storage named so SQLAlchemy opens it with psycopg 3,
    # on which dagster-postgres's NOTIFY fails (pipeline_defs/wiring/instance_storage.py).
    CONFIG_DAGSTER_STORAGE = "config.dagster_storage", 400
    LEDGER_NOT_MIGRATED = "ledger.not_migrated", 400
    # The PostgreSQL ledger stayed unreachable past the store's retry of a dropped
    # connection: the server is down or restarting, nothing the input can fix.
    LEDGER_UNAVAILABLE = "ledger.unavailable", 503
    LAUNCH_RUN_FAILED = "launch.run_failed", 400
    LAUNCH_GRAPHQL_FAILED = "launch.graphql_failed", 400
    # Providers: upstream failures are "bad gateway"/"unavailable", not a user's 400.
    PROVIDER_HTTP_ERROR = "provider.http_error", 502
    PROVIDER_RETRIES_EXHAUSTED = "provider.retries_exhausted", 503
    PROVIDER_BAD_RESPONSE = "provider.bad_response", 502
    PROVIDER_CONFIG = "provider.config", 400
    PROVIDER_NO_KEY = "provider.no_key", 400
    # The storage under the data root or the ledger refused a write: no step can fix that,
    # an operator must (free space, remount read-write, fix permissions).
    STORAGE_FULL = "storage.full", 507
    STORAGE_READ_ONLY = "storage.read_only", 503
    STORAGE_PERMISSION_DENIED = "storage.permission_denied", 503
    # The object storage (resources/storage, docs/DESIGN.md#storage): a local directory or a bucket.
    # Objects are immutable: a create-only put over an existing key and a compare-and-set
    # whose expected version is no longer current are conflicts with another writer.
    STORAGE_OBJECT_EXISTS = "storage.object_exists", 409
    STORAGE_PRECONDITION_FAILED = "storage.precondition_failed", 409
    STORAGE_OBJECT_MISSING = "storage.object_missing", 404
    # A directory, FIFO, device... where an object should be: resolved by hand, never opened.
    STORAGE_NOT_AN_OBJECT = "storage.not_an_object", 409
    STORAGE_INVALID_KEY = "storage.invalid_key", 400
    STORAGE_INVALID_URL = "storage.invalid_url", 400
    # A well-formed URL the environment does not configure (no Azure account, bad options).
    STORAGE_CONFIG = "storage.config", 400
    # The bucket's endpoint cannot be reached or answers with an error nobody typed.
    STORAGE_UNAVAILABLE = "storage.unavailable", 503
    # The configured bucket (or Azure container) does not exist at the endpoint: misnamed,
    # deleted, or the wrong endpoint/account. Never read as a missing object.
    STORAGE_BUCKET_MISSING = "storage.bucket_missing", 404
    # The Celery fleet (PIPELINE_EXECUTOR=celery): the broker cannot be reached; a Dagster
    # instance its workers cannot share (runs and events outside PostgreSQL).
    FLEET_BROKER_UNREACHABLE = "fleet.broker_unreachable", 503
    FLEET_INSTANCE_NOT_SHARED = "fleet.instance_not_shared", 400
    # A worker handed a run its Dagster instance does not hold (the launcher and the worker
    # point at different instances); a step whose queue no worker consumed past the wait.
    FLEET_INSTANCE_MISMATCH = "fleet.instance_mismatch", 400
    FLEET_QUEUE_UNSERVED = "fleet.queue_unserved", 503
    # An exception nobody typed (a bug or an unforeseen fault): kept with its type and text.
    INTERNAL = "internal", 500


# A code no family names (a user's step may raise text of its own): the caller's fault.
DEFAULT_STATUS = 400


def known_codes() -> dict[str, int]:
    """Every code text -> its status: :class:`ErrorCode` and every family a step declared
    (those whose modules are imported: a step's module is, wherever the step runs)."""
    found: dict[str, int] = {}
    families: list[type[Code]] = [Code]
    while families:
        family = families.pop()
        families.extend(family.__subclasses__())
        found.update((member.value, member.status) for member in family)
    return found


def status_of(code: str) -> int:
    """The HTTP-like status of ``code`` (a member or its text)."""
    if isinstance(code, Code):
        return code.status
    member = ErrorCode._value2member_map_.get(code)  # the protocol's own: no walk
    if isinstance(member, Code):
        return member.status
    return known_codes().get(code, DEFAULT_STATUS)


class PipelineError(Exception):
    """A failure the operator can act on: ``code`` is stable, ``message`` names the culprit.

    The outcomes callers tell apart have a subclass each (below, docs/DESIGN.md#error-tree);
    ``PipelineError(code, ...)`` returns the subclass its code has, so a raiser names the
    code and a catcher the class (``except StorageObjectMissing:``). Every subclass keeps its
    code and the constructor's signature, and pickles whole (code, status, origin, details).
    """

    # code text -> the class raised for it (each subclass names its own code).
    _by_code: ClassVar[dict[str, "type[PipelineError]"]] = {}

    def __init_subclass__(cls, *, code: Code | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            taken = PipelineError._by_code.setdefault(str(code), cls)
            if taken is not cls:
                raise TypeError(f"{code} is {taken.__name__}'s code, not {cls.__name__}'s")

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        code = args[0] if args else kwargs.get("code")
        subclass = PipelineError._by_code.get(str(code)) if code is not None else None
        if subclass is not None and issubclass(subclass, cls):
            cls = subclass  # a subclass of the one asked for
        return super().__new__(cls, *args, **kwargs)

    def __init__(
        self,
        code: Code | str,
        message: str,
        *,
        status: int | None = None,
        origin: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        codes = codes_of(type(self))
        if codes and str(code) not in codes:
            raise TypeError(f"{type(self).__name__} is raised for {sorted(codes)}, not {code}")
        # Kept as plain text: codes are compared and serialised as their stable strings.
        self.code = str(code)
        self.message = message
        self.status = status if status is not None else status_of(code)
        self.origin = origin
        self.details = dict(details or {})
        super().__init__(f"[{self.code}] {message}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt without calling __init__ (whose arguments ``args`` does not hold): the
        # class, its args and every attribute, so another process gets the same error.
        return (_restored, (type(self), self.args, self.__dict__))

    def as_metadata(self) -> dict[str, str]:
        """Flat text view for Dagster metadata and audit rows."""
        out = {
            "error/code": self.code,
            "error/message": self.message,
            "error/status": str(self.status),
        }
        if self.origin:
            out["error/origin"] = self.origin
        return out


def _restored(
    cls: type[PipelineError], args: tuple[Any, ...], state: dict[str, Any]
) -> PipelineError:
    error = Exception.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


def codes_of(cls: type[PipelineError]) -> frozenset[str]:
    """The codes ``cls`` is raised for (empty: any code, as ``PipelineError`` itself)."""
    if cls is PipelineError:
        return frozenset()
    return frozenset(c for c, sub in PipelineError._by_code.items() if issubclass(sub, cls))


def error_class_names() -> frozenset[str]:
    """The names of ``PipelineError`` and every class below it (how a serialized error,
    ``module.Name: [code] message``, is told typed)."""
    found: set[str] = set()
    classes: list[type[PipelineError]] = [PipelineError]
    while classes:
        cls = classes.pop()
        found.add(cls.__name__)
        classes.extend(cls.__subclasses__())
    return frozenset(found)


# The outcomes callers tell apart. A new one: a subclass naming its code, then ``except`` it.
class StorageObjectMissing(PipelineError, code=ErrorCode.STORAGE_OBJECT_MISSING):
    """No object at the key (a bucket that is missing is ``storage.bucket_missing``)."""


class StorageObjectExists(PipelineError, code=ErrorCode.STORAGE_OBJECT_EXISTS):
    """A create-only put met an object already at the key (another writer's, or ours)."""


class IntegrityViolation(PipelineError, code=ErrorCode.IO_INTEGRITY_VIOLATION):
    """Bytes that are not the ones recorded: edited outside the pipeline, or damaged."""


class SymlinkRefused(PipelineError, code=ErrorCode.CHECKPOINT_SYMLINK):
    """A link where a file or directory of ours should be: never followed nor removed."""


class BudgetExhausted(PipelineError, code=ErrorCode.BUDGET_EXHAUSTED):
    """The episode's provider calls reached its cap: nothing more is sent."""


class OwnershipLost(PipelineError, code=ErrorCode.STEP_OWNERSHIP_LOST):
    """The step's row is no longer this run's (its lease was taken over)."""


class LedgerNotMigrated(PipelineError, code=ErrorCode.LEDGER_NOT_MIGRATED):
    """The ledger is missing or not at the head revision."""


class InternalError(PipelineError, code=ErrorCode.INTERNAL):
    """An exception nobody typed, kept with its type and text."""


class OutageError(PipelineError):
    """An outage of what the pipeline stands on (the storage, the ledger), its retries spent:
    not a verdict on any checkpoint. The judge raises it as it is, never classifies it as
    drift or tampering (a block only a force lifts); the run fails, the next tick or launch
    tries again."""


class StorageUnavailable(OutageError, code=ErrorCode.STORAGE_UNAVAILABLE):
    """The bucket's endpoint cannot be reached or answers with an error nobody typed."""


class LedgerUnavailable(OutageError, code=ErrorCode.LEDGER_UNAVAILABLE):
    """The PostgreSQL ledger stayed unreachable past the store's retry."""


# The codes of an outage (:class:`OutageError`).
OUTAGES = codes_of(OutageError)
