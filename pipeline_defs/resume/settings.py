"""Validated settings of the judge and the ledger, read from ``PIPELINE_*`` variables.

Each field's variable, default, bounds and sources are a row of the settings registry
(``pipeline_defs/resume/settings_registry.py``); this module validates them together.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.partition import ID_PATTERN
from pipeline_defs.resume.settings_registry import (
    ENV,
    LEDGER,
    RESOURCE,
    SETTINGS,
    read,
)

# The bounds, as the tests and the project file's own cap know them.
from pipeline_defs.resume.settings_registry import MAX_CALLS_PER_EPISODE as MAX_CALLS_PER_EPISODE
from pipeline_defs.resume.settings_registry import MAX_OFFLINE_LATENCY_MS as MAX_OFFLINE_LATENCY_MS
from pipeline_defs.resume.settings_registry import MAX_RECOVERY_ATTEMPTS as MAX_RECOVERY_ATTEMPTS
from pipeline_defs.resume.settings_registry import MAX_SETTING_SECONDS as MAX_SETTING_SECONDS

ALLOWED_DB_SCHEMES = (
    "sqlite",
    "sqlite+pysqlite",
    "postgresql",
    "postgresql+psycopg",
    "postgresql+psycopg2",
)

# The schemes PIPELINE_STORAGE_URL may name: the one list. Each is a module
# ``resources/storage/schemes/<scheme>.py`` opening it, found by this name
# (``resources/storage/storage_schemes.py``); a new scheme is its module and its name here.
STORAGE_SCHEMES: tuple[str, ...] = ("file", "s3", "gs", "az")

# The judge's limits, which the sensor daemon and every run worker must share: these may live
# in the ledger's ``settings`` table (the registry's rows with the ledger among their
# sources). ``home`` and ``db_url`` locate the ledger, so they cannot be kept in it;
# ``offline_latency_ms`` is a per-process knob of the offline models, no limit of the judge.
LEDGER_KEYS: tuple[str, ...] = SETTINGS.keys_from(LEDGER)

# Where a value in force came from, highest precedence first.
SOURCE_RESOURCE = RESOURCE  # set in code, on the code location's PipelineResource
SOURCE_ENV = ENV  # a PIPELINE_* variable of this process
SOURCE_LEDGER = LEDGER  # the ledger's settings table
SOURCE_DEFAULT = "default"


class ResumeSettings(BaseModel):
    """Every knob of the judge. Invalid values refuse to start, naming the setting."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Each field's default, bounds and doc: its row in the settings registry.
    home: Path = SETTINGS["home"].model_field()
    db_url: str | None = SETTINGS["db_url"].model_field()
    # Where checkpoints and artifacts live (docs/DESIGN.md#storage): None, the home itself;
    # s3://, gs://, az:// a bucket (``home`` is then scratch that a worker can lose).
    storage_url: str | None = SETTINGS["storage_url"].model_field()
    running_timeout_seconds: int = SETTINGS["running_timeout_seconds"].model_field()
    max_recovery_attempts: int = SETTINGS["max_recovery_attempts"].model_field()
    retry_backoff_seconds: int = SETTINGS["retry_backoff_seconds"].model_field()
    # The offline models read PIPELINE_OFFLINE_LATENCY_MS again at each call (so a changed
    # value applies without a reload); it is validated here too so that a bad value refuses
    # when settings are read (start of a run, sensor tick, CLI command), not only at the
    # first provider call deep inside a run.
    offline_latency_ms: int = SETTINGS["offline_latency_ms"].model_field()
    # Leases: a running step renews its row's heartbeat_at every
    # heartbeat_seconds; a running row whose heartbeat is older than lease_seconds is stale,
    # however long the step has run. running_timeout_seconds then applies only to rows that
    # carry no heartbeat. Float fields refuse "nan" and "inf" (``Setting.model_field``).
    heartbeat_seconds: float = SETTINGS["heartbeat_seconds"].model_field()
    lease_seconds: float = SETTINGS["lease_seconds"].model_field()
    # On object storage the sensor compares every episode's published objects and inputs
    # with the ledger once per this period (one LIST each, spread over the ticks): how long
    # an object deleted or replaced behind the ledger's back can go unnoticed by a judge
    # that trusts seals. Runs and the IO manager always verify in full.
    scrub_period_seconds: float = SETTINGS["scrub_period_seconds"].model_field()
    # The spend cap: the provider meter refuses, before sending, a call that would take the
    # episode's recorded calls past it; ``budget.max_calls_per_episode`` in a project's
    # ``project.yaml`` overrides it for that project (docs/DESIGN.md#spend-cap).
    max_calls_per_episode: int = SETTINGS["max_calls_per_episode"].model_field()
    # Where ``max_calls_per_episode`` came from (one of the SOURCE_* below): the refusal
    # names the command that raises it there. Set by ``resolve_settings``; no variable.
    max_calls_source: str = "default"

    @model_validator(mode="after")
    def _lease_outlives_heartbeats(self) -> "ResumeSettings":
        # Two missed renewals must not be enough to lose a live lease.
        if self.lease_seconds < 2 * self.heartbeat_seconds:
            raise ValueError(
                f"lease_seconds ({self.lease_seconds}) must be at least twice "
                f"heartbeat_seconds ({self.heartbeat_seconds})"
            )
        return self

    @field_validator("db_url")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in ALLOWED_DB_SCHEMES:
            raise ValueError(
                f"unknown database scheme {scheme or value!r}; expected one of {ALLOWED_DB_SCHEMES}"
            )
        return value

    @field_validator("storage_url")
    @classmethod
    def _known_storage(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        scheme = value.split("://", 1)[0].lower() if "://" in value else "file"
        if scheme not in STORAGE_SCHEMES:
            raise ValueError(
                f"unknown storage scheme {scheme!r}; expected one of {STORAGE_SCHEMES} "
                "or a local path"
            )
        return value.strip()

    @property
    def object_storage(self) -> bool:
        """Checkpoints are published as objects (a bucket, or a directory used the same
        way) and the home is scratch; unset, they are files under the home."""
        return self.storage_url is not None

    @property
    def ledger_url(self) -> str:
        """The ledger URL: the configured one, else SQLite under the data root."""
        ledger_file = Path(DataLayout.of(self.home).ledger_file)
        return self.db_url or f"sqlite:///{ledger_file.resolve()}"

    @classmethod
    def build(
        cls, *, _sources: Mapping[str, str] | None = None, **values: object
    ) -> "ResumeSettings":
        """Validate, turning pydantic's error into a typed one that names the setting.

        ``_sources`` (setting -> source) names where a bad value came from: a ledger value is
        named as the ledger setting, anything else by its environment variable.
        """
        clean = {k: v for k, v in values.items() if v is not None and v != ""}
        try:
            return cls(**clean)
        except ValidationError as exc:
            first = exc.errors()[0]
            sources = _sources or {}
            if not first["loc"]:  # the model-level check: the lease/heartbeat pair
                pair = ("lease_seconds", "heartbeat_seconds")
                where = ", ".join(
                    _where(
                        n,
                        sources.get(n, SOURCE_ENV if n in clean else SOURCE_DEFAULT),
                        clean.get(n),
                    )
                    for n in pair
                )
                raise PipelineError(
                    ErrorCode.SETTINGS_INVALID,
                    f"invalid setting lease_seconds ({where}): {first['msg']}",
                    details={"setting": "lease_seconds"},
                ) from None
            name = ".".join(str(p) for p in first["loc"])
            source = sources.get(name, SOURCE_ENV)
            raise _invalid(name, source, first.get("input"), _why(first)) from None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, **overrides: object
    ) -> "ResumeSettings":
        """Read ``PIPELINE_*`` variables (at call time, never at import), then apply overrides."""
        return resolve_settings(env, ledger=None, **overrides).settings

    @classmethod
    def locate(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        home: object = None,
        db_url: object = None,
        storage_url: object = None,
    ) -> "ResumeSettings":
        """Only where the data and the ledger live (the rest at its defaults).

        Finding the ledger must not depend on the limits kept in it; nor must one bad limit
        stop an operator from reaching the ledger to repair it (``storyboard settings set``).
        """
        return cls.build(
            home=home if home is not None else read(ENV_NAMES["home"], env),
            db_url=db_url if db_url is not None else read(ENV_NAMES["db_url"], env),
            storage_url=(
                storage_url if storage_url is not None else read(ENV_NAMES["storage_url"], env)
            ),
        )


# setting name -> environment variable, for every field but ``max_calls_source``, in the
# fields' order (the order they are read and checked in).
ENV_NAMES: dict[str, str] = SETTINGS.env_names(
    tuple(name for name in ResumeSettings.model_fields if name != "max_calls_source")
)


def _where(name: str, source: str, value: object) -> str:
    """Where the operator finds (and fixes) a value: its ledger key or its variable."""
    if source == SOURCE_LEDGER:
        return f"ledger setting {name}={value!r}"
    if source == SOURCE_DEFAULT:
        return f"{name} default {ResumeSettings.model_fields[name].default!r}"
    return f"{ENV_NAMES.get(name, name)}={value!r}"


def _why(error: Mapping[str, Any]) -> str:
    """Pydantic's complaint, in the operator's words where its own would mislead."""
    if error["type"] == "finite_number":  # nan, inf, -inf, Infinity
        return "not a number: a finite number is expected (nan and infinity are refused)"
    return str(error["msg"])


def _invalid(name: str, source: str, value: object, why: str) -> PipelineError:
    return PipelineError(
        ErrorCode.SETTINGS_INVALID,
        f"invalid setting {name} ({_where(name, source, value)}): {why}",
        details={"setting": name},
    )


@dataclass(frozen=True)
class EffectiveSettings:
    """The settings in force and, per setting, where its value came from."""

    settings: ResumeSettings
    sources: Mapping[str, str]

    def rows(self, keys: tuple[str, ...] = LEDGER_KEYS) -> list[dict[str, Any]]:
        """One row per setting: key, value, source, environment variable (for status)."""
        return [
            {
                "key": key,
                "value": getattr(self.settings, key),
                "source": self.sources.get(key, SOURCE_DEFAULT),
                "env": ENV_NAMES[key],
            }
            for key in keys
        ]

    def registry_rows(self, env: Mapping[str, str] | None = None) -> list[dict[str, str]]:
        """One row per setting of the registry, in its order: key, variable, value as an
        operator may see it (``Setting.shown``), source. The judge's settings as in force;
        the others (read where they are used) as this process's variable sets them, else
        their default (``env``: this process's environment, read now)."""
        rows = []
        for setting in SETTINGS:
            if setting.key in ENV_NAMES:
                value: object = getattr(self.settings, setting.key)
                source = self.sources.get(setting.key, SOURCE_DEFAULT)
            else:
                text = read(setting.var, env)
                value, source = (text, SOURCE_ENV) if text else (setting.default, SOURCE_DEFAULT)
            shown = setting.shown(None if value is None else format_value(value))
            rows.append(
                {"key": setting.key, "variable": setting.var, "value": shown, "source": source}
            )
        return rows


def resolve_settings(
    env: Mapping[str, str] | None = None,
    *,
    ledger: Mapping[str, str] | None = None,
    **overrides: object,
) -> EffectiveSettings:
    """The one precedence: resource override, then ``PIPELINE_*`` variable, then the ledger's
    settings table, then the default. The environment is read at call time, never at import."""
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for name, var in ENV_NAMES.items():
        for origin, value in (
            (SOURCE_RESOURCE, overrides.get(name)),
            (SOURCE_ENV, read(var, env)),
            (SOURCE_LEDGER, (ledger or {}).get(name) if name in LEDGER_KEYS else None),
        ):
            if value is not None and value != "":
                values[name], sources[name] = value, origin
                break
        else:
            sources[name] = SOURCE_DEFAULT
    unknown = set(overrides) - set(ENV_NAMES)
    if unknown:  # the model refuses them, naming the first
        values.update({k: overrides[k] for k in unknown})
    values["max_calls_source"] = sources["max_calls_per_episode"]
    return EffectiveSettings(ResumeSettings.build(_sources=sources, **values), sources)


def _field_adapter(name: str) -> TypeAdapter[Any]:
    info = ResumeSettings.model_fields[name]
    # A type form built at run time from the field: no static type for mypy to check.
    return TypeAdapter(Annotated[info.annotation, info])  # type: ignore[arg-type]


def format_value(value: object) -> str:
    """How a validated value is stored: ``90`` rather than ``90.0`` for a whole float."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def validate_ledger_values(values: Mapping[str, str]) -> dict[str, str]:
    """Validate the whole settings table (over the defaults); return it in canonical form.

    The bounds are the model's own; the table is validated as a whole so that a pair that
    belongs together (lease at least twice the heartbeat) cannot be broken one key at a time.
    """
    for key in values:
        if key not in LEDGER_KEYS:
            raise PipelineError(
                ErrorCode.SETTINGS_INVALID,
                f"{key!r} is no ledger setting; the ledger holds: {', '.join(LEDGER_KEYS)}",
                details={"setting": key},
            )
        if not str(values[key]).strip():  # ``build`` reads "" as unset: the default
            raise PipelineError(
                ErrorCode.SETTINGS_INVALID,
                f"ledger setting {key}: an empty value is no value (a number is expected)",
                details={"setting": key},
            )
    sources = dict.fromkeys(values, SOURCE_LEDGER)
    settings = ResumeSettings.build(_sources=sources, **values)
    return {key: format_value(getattr(settings, key)) for key in values}


def env_ledger_values(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ledger-kept settings this environment sets (what ``storyboard migrate`` seeds)."""
    texts = {key: read(ENV_NAMES[key], env) for key in LEDGER_KEYS}
    return {key: text for key, text in texts.items() if text != ""}


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """Refuse a bad ``PIPELINE_*`` variable now (code location load, CLI start), naming it.

    Each set variable is checked against its own bounds. The lease/heartbeat pair is checked
    together only when both are set: with one of them, the other may come from the ledger,
    which is not read here (the check runs before any database is reached; see
    :func:`check_environment_against_ledger`). ``PIPELINE_CRASH_AT`` must name a stage.
    """
    texts = {name: read(var, env) for name, var in ENV_NAMES.items()}
    set_vars = {name: text for name, text in texts.items() if text != ""}
    for name, value in set_vars.items():
        if name in ("home", "db_url", "storage_url"):
            ResumeSettings.build(_sources=None, **{name: value})
            continue
        try:
            _field_adapter(name).validate_python(value)
        except ValidationError as exc:
            raise _invalid(name, SOURCE_ENV, value, _why(exc.errors()[0])) from None
    if "lease_seconds" in set_vars and "heartbeat_seconds" in set_vars:
        ResumeSettings.build(
            lease_seconds=set_vars["lease_seconds"],
            heartbeat_seconds=set_vars["heartbeat_seconds"],
        )
    check_crash_point(env)


# The pair one ``PIPELINE_*`` variable may set half of while the ledger holds the other.
LEASE_PAIR: tuple[str, str] = ("lease_seconds", "heartbeat_seconds")


def check_environment_against_ledger(
    read_ledger: Callable[[], Mapping[str, str]], env: Mapping[str, str] | None = None
) -> None:
    """Refuse a variable that breaks the lease/heartbeat pair with the ledger's other half.

    :func:`check_environment` cannot judge one half of the pair alone (it runs before any
    database is reached); a command that reads the ledger anyway calls this at its start,
    so the refusal comes before it launches a run that would fail on it.
    ``read_ledger`` is called only when exactly one half is set in the environment: the
    only case the two sources can disagree (both set were checked together already, and
    the table is validated as a whole when it is written).
    """
    texts = {name: read(ENV_NAMES[name], env) for name in LEASE_PAIR}
    in_env = [n for n in LEASE_PAIR if texts[n] != ""]
    if len(in_env) != 1:
        return
    ledger = read_ledger()
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for name in LEASE_PAIR:
        if name in in_env:
            values[name], sources[name] = texts[name], SOURCE_ENV
        elif ledger.get(name, "") != "":
            values[name], sources[name] = ledger[name], SOURCE_LEDGER
        else:
            sources[name] = SOURCE_DEFAULT
    ResumeSettings.build(_sources=sources, **values)


# ``PIPELINE_CRASH_AT`` (``pipeline_defs.steps.faults``): the crash tests' kill switch. Its
# stages live here, in the core, so that the start-up check of every ``PIPELINE_*``
# variable can refuse a misspelt one: a value naming no stage was accepted and then never
# fired, and a crash test believed it had killed the process where it had not.
CRASH_ENV = SETTINGS["crash_at"].var
CRASH_STAGES: tuple[str, ...] = (
    "claimed",
    "executed",
    "mutation.pending_written",
    "published",
    "mutation.victim_written",
    "finished",
)
# ``replied.<n>``: right after the n-th paid reply of the step's run came back and was kept
# in the journal of paid replies, before the step uses it (a kill after k of n replies).
REPLIED_STAGE = "replied."


def _is_stage(stage: str) -> bool:
    if stage in CRASH_STAGES:
        return True
    number = stage.removeprefix(REPLIED_STAGE)
    return number != stage and number.isdigit() and number.isascii() and int(number) >= 1


def check_crash_point(env: Mapping[str, str] | None = None) -> None:
    """``PIPELINE_CRASH_AT`` unset, ``<stage>`` or ``<step>:<stage>`` with a known stage."""
    value = read(CRASH_ENV, env)
    if value == "":
        return
    step, colon, stage = value.rpartition(":")
    if _is_stage(stage) and (not colon or ID_PATTERN.fullmatch(step) is not None):
        return
    raise PipelineError(
        ErrorCode.SETTINGS_INVALID,
        f"invalid {CRASH_ENV}={value!r}: expected <step>:<stage> or <stage>, the stage one "
        f"of {', '.join(CRASH_STAGES)} or {REPLIED_STAGE}<n>",
        details={"setting": CRASH_ENV},
    )
