"""Validated settings of the judge and the ledger, read from ``PIPELINE_*`` variables."""

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline_defs.resume.errors import PipelineError

ALLOWED_DB_SCHEMES = (
    "sqlite",
    "sqlite+pysqlite",
    "postgresql",
    "postgresql+psycopg",
    "postgresql+psycopg2",
)

# setting name -> environment variable
ENV_NAMES: dict[str, str] = {
    "home": "PIPELINE_HOME",
    "db_url": "PIPELINE_DB_URL",
    "running_timeout_seconds": "PIPELINE_RUNNING_TIMEOUT_SECONDS",
    "max_recovery_attempts": "PIPELINE_MAX_RECOVERY_ATTEMPTS",
    "retry_backoff_seconds": "PIPELINE_RETRY_BACKOFF_SECONDS",
    "offline_latency_ms": "PIPELINE_OFFLINE_LATENCY_MS",
    "heartbeat_seconds": "PIPELINE_HEARTBEAT_SECONDS",
    "lease_seconds": "PIPELINE_LEASE_SECONDS",
}

# Upper bounds. Without them a value validated and broke later instead: a timeout of
# 10**22 s raised OverflowError in the judge (``timedelta``), and a huge backoff overflowed
# ``now + attempts * backoff``. The bounds are far above any sane setting and keep that
# arithmetic (at most 1000 x 30 days after now) well inside ``datetime``'s range.
MAX_SETTING_SECONDS = 30 * 24 * 3600  # 30 days
MAX_RECOVERY_ATTEMPTS = 1000
MAX_OFFLINE_LATENCY_MS = 600_000  # 10 minutes per simulated call


class ResumeSettings(BaseModel):
    """Every knob of the judge. Invalid values refuse to start, naming the setting."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    home: Path = Path(".pipeline")
    db_url: str | None = None
    running_timeout_seconds: int = Field(default=3600, gt=0, le=MAX_SETTING_SECONDS)
    max_recovery_attempts: int = Field(default=3, ge=1, le=MAX_RECOVERY_ATTEMPTS)
    retry_backoff_seconds: int = Field(default=30, ge=0, le=MAX_SETTING_SECONDS)
    # The offline models read PIPELINE_OFFLINE_LATENCY_MS again at each call (so a changed
    # value applies without a reload); it is validated here too so that a bad value refuses
    # when settings are read (start of a run, sensor tick, CLI command), not only at the
    # first provider call deep inside a run.
    offline_latency_ms: int = Field(default=0, ge=0, le=MAX_OFFLINE_LATENCY_MS)
    # Leases (issue 11 §2): a running step renews its row's heartbeat_at every
    # heartbeat_seconds; a running row whose heartbeat is older than lease_seconds is stale,
    # however long the step has run. running_timeout_seconds then applies only to rows that
    # carry no heartbeat.
    heartbeat_seconds: float = Field(default=10, gt=0, le=3600)
    lease_seconds: float = Field(default=60, gt=0, le=MAX_SETTING_SECONDS)

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

    @property
    def ledger_url(self) -> str:
        """The ledger URL: the configured one, else SQLite under the data root."""
        return self.db_url or f"sqlite:///{(self.home / 'ledger.sqlite3').resolve()}"

    @classmethod
    def build(cls, **values: object) -> "ResumeSettings":
        """Validate, turning pydantic's error into a typed one that names the setting."""
        clean = {k: v for k, v in values.items() if v is not None and v != ""}
        try:
            return cls(**clean)  # type: ignore[arg-type]
        except ValidationError as exc:
            first = exc.errors()[0]
            name = ".".join(str(p) for p in first["loc"]) or "lease_seconds"
            env = ENV_NAMES.get(name, name)
            raise PipelineError(
                "settings.invalid",
                f"invalid setting {name} ({env}={first.get('input')!r}): {first['msg']}",
                details={"setting": name},
            ) from None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, **overrides: object
    ) -> "ResumeSettings":
        """Read ``PIPELINE_*`` variables (at call time, never at import), then apply overrides."""
        source = os.environ if env is None else env
        values: dict[str, object] = {name: source.get(var) for name, var in ENV_NAMES.items()}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.build(**values)
