"""Every ``PIPELINE_*`` variable in one table, and the one place that reads them.

A row (:class:`Setting`) gives a variable's setting name, type, default, bounds, the sources
it may come from (the environment, the ledger's ``settings`` table, a field of the code
location's ``PipelineResource``) and a one-line doc. From the table come the judge's
validated settings (``pipeline_defs/resume/settings.py``: each field's default and bounds),
the fleet's and the bucket storage's (their variables, defaults and bounds), the keys the
ledger holds (``storyboard settings set``), the rows ``storyboard settings show`` prints, the
resource's fields and their launchpad help (``resources/pipeline.py``) and the variable
table of README.md (:func:`markdown_table`, kept equal by
``tests/core/test_settings_surfaces.py``).

:func:`read` is the only reader of a ``PIPELINE_*`` variable, at call time (never at
import); no other module names one (``tests/core/test_settings_registry.py``).
"""

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field

# Where a value may come from (and, in ``settings.py``, where a value in force came from).
ENV = "env"  # a PIPELINE_* variable of this process
LEDGER = "ledger"  # the ledger's settings table, shared by the sensor and every run worker
RESOURCE = "resource"  # set in code, on the code location's PipelineResource

# Upper bounds. Without them a value validated and broke later instead: a timeout of
# 10**22 s raised OverflowError in the judge (``timedelta``), and a huge backoff overflowed
# ``now + attempts * backoff``. The bounds are far above any sane setting and keep that
# arithmetic (at most 1000 x 30 days after now) well inside ``datetime``'s range.
MAX_SETTING_SECONDS = 30 * 24 * 3600  # 30 days
MAX_RECOVERY_ATTEMPTS = 1000
MAX_OFFLINE_LATENCY_MS = 600_000  # 10 minutes per simulated call
# The spend cap (docs/DESIGN.md#spend-cap): provider calls one episode may record, all its
# runs together. The demo's episodes record 24 and 26 calls and ``add-episode`` estimates
# 35 for each; 200 leaves room for several forced rebuilds of such an episode and refuses
# a runaway story (a 1 MB story started 5,880 calls) before it spends.
DEFAULT_MAX_CALLS_PER_EPISODE = 200
MAX_CALLS_PER_EPISODE = 10_000_000
MAX_STORAGE_SECONDS = 86_400  # a bucket request's timeout, retries and retry budget


UNSET = "(unset)"
# ``scheme://user:password@host``: the password of a URL a setting may hold.
_URL_PASSWORD = re.compile(r"(://[^/@:]*:)[^/]*@")


@dataclass(frozen=True)
class Setting:
    """One ``PIPELINE_*`` variable: what it sets, of what type, within which bounds."""

    key: str  # the setting's name in code: a field, a ledger key, a resource field
    var: str  # its environment variable
    type: type  # the Python type of a valid value
    default: Any  # a value of ``type``, or None (unset)
    doc: str  # one line: what it sets
    sources: tuple[str, ...] = (ENV,)
    gt: float | None = None
    ge: float | None = None
    le: float | None = None
    kind: str = ""  # how the docs name the type, when not the type's own name

    @property
    def type_name(self) -> str:
        return self.kind or self.type.__name__

    @property
    def bounds(self) -> str:
        """The bounds as the docs print them (``> 0, <= 3600``); empty when none."""
        low = f"> {self.gt:g}" if self.gt is not None else ""
        low = f">= {self.ge:g}" if self.ge is not None else low
        high = f"<= {self.le:g}" if self.le is not None else ""
        return ", ".join(part for part in (low, high) if part)

    def closed_range(self) -> tuple[float, float]:
        """``(ge, le)`` of a setting bounded on both sides, inclusive."""
        if self.ge is None or self.le is None:
            raise ValueError(f"{self.var} has no closed range")
        return self.ge, self.le

    def model_field(self) -> Any:
        """The pydantic field of a validated settings model: default, bounds, doc."""
        return Field(
            default=self.default,
            description=self.doc,
            gt=self.gt,
            ge=self.ge,
            le=self.le,
            # "nan" and "inf" parse as floats, and nan fails every bound check, so they
            # were refused with a bound they do not break; they are no number.
            allow_inf_nan=False if self.type is float else None,
        )

    def shown(self, value: object) -> str:
        """``value`` as an operator may see it printed: a secret only as set or not, a
        URL's password hidden, no value as ``(unset)``."""
        if value is None or value == "":
            return UNSET
        if self.kind == "secret":
            return "(set)"
        text = str(value)
        if self.kind == "url":
            return _URL_PASSWORD.sub(r"\1***@", text)
        return text

    def resource_field(self) -> Any:
        """The ``PipelineResource`` field: unset by default, the doc as the launchpad's help."""
        if RESOURCE not in self.sources:
            raise ValueError(f"{self.var} is not set on the resource (sources {self.sources})")
        then = ", then the ledger's setting" if LEDGER in self.sources else ""
        return Field(
            default=None, description=f"{self.doc} (unset: {self.var}{then}, then the default)"
        )


class Registry:
    """The table: settings by key and by variable, in the order the docs list them."""

    def __init__(self, settings: tuple[Setting, ...]) -> None:
        self.settings = settings
        self._by_key = {s.key: s for s in settings}
        self._by_var = {s.var: s for s in settings}
        if len(self._by_key) != len(settings) or len(self._by_var) != len(settings):
            raise ValueError("a setting key or variable is listed twice")
        for setting in settings:
            if not setting.var.startswith("PIPELINE_"):
                raise ValueError(f"{setting.var} is no PIPELINE_* variable")

    def __iter__(self) -> Iterator[Setting]:
        return iter(self.settings)

    def __getitem__(self, key: str) -> Setting:
        return self._by_key[key]

    def with_setting(self, setting: Setting) -> "Registry":
        """This table and one more row (how a test walks the recipe of a new setting)."""
        return Registry((*self.settings, setting))

    def keys_from(self, source: str) -> tuple[str, ...]:
        """The keys that may come from ``source`` (``LEDGER``: what the ledger holds)."""
        return tuple(s.key for s in self.settings if source in s.sources)

    def env_names(self, keys: tuple[str, ...]) -> dict[str, str]:
        return {key: self._by_key[key].var for key in keys}

    def read(self, var: str, env: Mapping[str, str] | None = None) -> str:
        """The variable's text in ``env`` (default: this process's, read now), "" when
        unset. Only a variable of the table is read."""
        if var not in self._by_var:
            raise KeyError(f"{var} is not in the settings registry")
        source = os.environ if env is None else env
        return source.get(var) or ""


_JUDGE = (ENV, LEDGER, RESOURCE)  # the judge's limits, shared through the ledger
_WHERE = (ENV, RESOURCE)  # where the data and the ledger live: not in the ledger

SETTINGS = Registry(
    (
        Setting(
            "home",
            "PIPELINE_HOME",
            Path,
            Path(".pipeline"),
            "the data root: projects, "
            "episodes, the SQLite ledger, local checkpoints (scratch with a bucket)",
            _WHERE,
            kind="path",
        ),
        Setting(
            "db_url",
            "PIPELINE_DB_URL",
            str,
            None,
            "the ledger's database URL (sqlite://, postgresql+psycopg://); default SQLite "
            "under the home",
            _WHERE,
            kind="url",
        ),
        Setting(
            "storage_url",
            "PIPELINE_STORAGE_URL",
            str,
            None,
            "where checkpoints are published: unset, files under the home; s3://, gs://, "
            "az:// a bucket (the home is then scratch)",
            _WHERE,
            kind="url",
        ),
        Setting(
            "running_timeout_seconds",
            "PIPELINE_RUNNING_TIMEOUT_SECONDS",
            int,
            3600,
            "a running row without a readable heartbeat is stale after this long",
            _JUDGE,
            gt=0,
            le=MAX_SETTING_SECONDS,
        ),
        Setting(
            "lease_seconds",
            "PIPELINE_LEASE_SECONDS",
            float,
            60,
            "a running step whose heartbeat is older is stale; at least twice the heartbeat",
            _JUDGE,
            gt=0,
            le=MAX_SETTING_SECONDS,
        ),
        Setting(
            "heartbeat_seconds",
            "PIPELINE_HEARTBEAT_SECONDS",
            float,
            10,
            "how often a running step renews its lease",
            _JUDGE,
            gt=0,
            le=3600,
        ),
        Setting(
            "max_recovery_attempts",
            "PIPELINE_MAX_RECOVERY_ATTEMPTS",
            int,
            3,
            "automatic recoveries of a step (failed or stale) before it blocks",
            _JUDGE,
            ge=1,
            le=MAX_RECOVERY_ATTEMPTS,
        ),
        Setting(
            "retry_backoff_seconds",
            "PIPELINE_RETRY_BACKOFF_SECONDS",
            int,
            30,
            "the wait before a failed step is retried, times its attempts so far",
            _JUDGE,
            ge=0,
            le=MAX_SETTING_SECONDS,
        ),
        Setting(
            "max_calls_per_episode",
            "PIPELINE_MAX_CALLS_PER_EPISODE",
            int,
            DEFAULT_MAX_CALLS_PER_EPISODE,
            "the spend cap: provider calls one episode may record, all its runs together",
            _JUDGE,
            ge=1,
            le=MAX_CALLS_PER_EPISODE,
        ),
        Setting(
            "offline_latency_ms",
            "PIPELINE_OFFLINE_LATENCY_MS",
            int,
            0,
            "the offline models' simulated latency per call (read again at each call)",
            ge=0,
            le=MAX_OFFLINE_LATENCY_MS,
        ),
        Setting(
            "scrub_period_seconds",
            "PIPELINE_SCRUB_PERIOD_SECONDS",
            float,
            3600,
            "the sensor compares each episode's published objects with the ledger once "
            "per this period",
            gt=0,
            le=MAX_SETTING_SECONDS,
        ),
        Setting(
            "crash_at",
            "PIPELINE_CRASH_AT",
            str,
            None,
            "the crash tests' kill switch: <step>:<stage> or <stage> kills the process there",
            kind="stage",
        ),
        Setting(
            "executor",
            "PIPELINE_EXECUTOR",
            str,
            "multiprocess",
            "what runs a run's steps: multiprocess (a process per step) or celery (the fleet)",
            kind="choice",
        ),
        Setting(
            "celery_broker_url",
            "PIPELINE_CELERY_BROKER_URL",
            str,
            "pyamqp://guest@127.0.0.1:5672//",
            "the fleet's Celery broker (amqp, pyamqp, amqps, redis, rediss)",
            kind="url",
        ),
        Setting(
            "celery_backend_url",
            "PIPELINE_CELERY_BACKEND_URL",
            str,
            "redis://127.0.0.1:6379/0",
            "the fleet's Celery result backend (redis, rediss, rpc)",
            kind="url",
        ),
        Setting(
            "celery_queue",
            "PIPELINE_CELERY_QUEUE",
            str,
            "dagster",
            "the queue the fleet's runs and workers use (1-100 letters, digits, '_' or '-')",
            kind="name",
        ),
        Setting(
            "celery_queue_wait_seconds",
            "PIPELINE_CELERY_QUEUE_WAIT_SECONDS",
            float,
            300.0,
            "how long a step waits on a queue no worker consumes before its run fails",
            ge=1,
            le=86_400,
        ),
        Setting(
            "storage_timeout_seconds",
            "PIPELINE_STORAGE_TIMEOUT_SECONDS",
            float,
            30.0,
            "a bucket request's timeout",
            ge=0.001,
            le=MAX_STORAGE_SECONDS,
        ),
        Setting(
            "storage_retries",
            "PIPELINE_STORAGE_RETRIES",
            int,
            None,
            "at most this many retries of a bucket request (unset: only the budget ends them)",
            ge=0,
            le=MAX_STORAGE_SECONDS,
        ),
        Setting(
            "storage_retry_budget_seconds",
            "PIPELINE_STORAGE_RETRY_BUDGET_SECONDS",
            float,
            120.0,
            "a bucket request is retried within this long from its first try",
            ge=0.001,
            le=MAX_STORAGE_SECONDS,
        ),
        Setting(
            "provider_api_key",
            "PIPELINE_PROVIDER_API_KEY",
            str,
            None,
            "a real "
            "provider's API key (the default variable; a project's api_key_env may name "
            "another)",
            kind="secret",
        ),
    )
)


def read(var: str, env: Mapping[str, str] | None = None) -> str:
    """``var``'s text in ``env`` (default: this process's, read now), "" when unset."""
    return SETTINGS.read(var, env)


def var(key: str) -> str:
    """The environment variable of the setting ``key``."""
    return SETTINGS[key].var


def markdown_table(registry: Registry = SETTINGS) -> str:
    """The docs' variable table, one row per setting, as README.md holds it."""
    lines = [
        "| variable | type | default | bounds | from | what it sets |",
        "|---|---|---|---|---|---|",
    ]
    for s in registry:
        default = "" if s.default is None else f"`{s.default}`"
        lines.append(
            f"| `{s.var}` | {s.type_name} | {default} | {s.bounds} | "
            f"{', '.join(s.sources)} | {s.doc} |"
        )
    return "\n".join(lines) + "\n"
