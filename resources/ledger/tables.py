"""SQLAlchemy Core models of the ledger. Timestamps are ISO-8601 UTC text, never cast in SQL."""

import sqlalchemy as sa

from pipeline_defs.resume.status import StepStatus

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "pk": "pk_%(table_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
    }
)

STEP_STATUSES = tuple(s.value for s in StepStatus)


def status_check(column: str) -> str:
    """The CHECK text allowing ``column`` only the StepStatus values (NULL passes a CHECK)."""
    return f"{column} IN ({', '.join(repr(s) for s in STEP_STATUSES)})"


step_run = sa.Table(
    "step_run",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("project_id", sa.String(64), nullable=False),
    sa.Column("episode_id", sa.String(64), nullable=False),
    sa.Column("step_id", sa.String(64), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("run_id", sa.String(128)),
    sa.Column("resolved_model", sa.Text),
    sa.Column("input_hash", sa.String(64)),
    sa.Column("upstream_revision", sa.Text),
    sa.Column("prompt_version", sa.Text),
    sa.Column("applicable_count", sa.Integer),
    sa.Column("completed_count", sa.Integer),
    sa.Column("failed_count", sa.Integer),
    sa.Column("error_message", sa.Text),
    sa.Column("result_summary", sa.Text),
    sa.Column("started_at", sa.Text),
    sa.Column("completed_at", sa.Text),
    sa.Column("created_at", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
    sa.Column("recovery_count", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Column("last_recovery_reason", sa.Text),
    sa.Column("retry_not_before", sa.Text),
    sa.Column("lock_owner", sa.Text),
    sa.Column("heartbeat_at", sa.Text),
    # What the owner verified when it published (resources.checkpoints.seal); NULL = none.
    sa.Column("checkpoint_seal", sa.Text),
    # On object storage, the published checkpoint: its manifest (resources.checkpoints
    # .manifest), the commit pointer. Set only by an owner-aware update; kept whatever the
    # status (a failed re-run leaves the last published checkpoint in place, as a local
    # file stays). NULL on a local directory, where the file itself is published.
    sa.Column("checkpoint_pointer", sa.Text),
    # The lineage of the work the row's claims do: the journal of paid replies keeps each
    # reply under it (docs/DESIGN.md#reply-journal). Kept by a claim that goes on with the
    # same work, new at one that starts new work; NULL until the first claim.
    sa.Column("journal_lineage", sa.String(36)),
    sa.UniqueConstraint("project_id", "episode_id", "step_id"),
    sa.CheckConstraint(status_check("status"), name="status"),
)
sa.Index("ix_step_run_status", step_run.c.status)
sa.Index("ix_step_run_updated_at", step_run.c.updated_at)

step_transition = sa.Table(
    "step_transition",
    metadata,
    sa.Column(
        "transition_seq",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("project_id", sa.String(64), nullable=False),
    sa.Column("episode_id", sa.String(64), nullable=False),
    sa.Column("step_id", sa.String(64), nullable=False),
    sa.Column("from_status", sa.String(16)),
    sa.Column("to_status", sa.String(16)),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("origin", sa.String(32)),
    sa.Column("reason", sa.Text),
    sa.Column("run_id", sa.String(128)),
    sa.Column("launch_path", sa.String(16)),
    sa.Column("at", sa.Text, nullable=False),
    sa.Column("worker", sa.String(160)),  # host:pid of the process that wrote the line
    sa.CheckConstraint(status_check("from_status"), name="from_status"),
    sa.CheckConstraint(status_check("to_status"), name="to_status"),
)
sa.Index(
    "ix_step_transition_key",
    step_transition.c.project_id,
    step_transition.c.episode_id,
    step_transition.c.step_id,
)

provider_call = sa.Table(
    "provider_call",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("project_id", sa.String(64), nullable=False),
    sa.Column("episode_id", sa.String(64), nullable=False),
    sa.Column("step_id", sa.String(64), nullable=False),
    sa.Column("run_id", sa.String(128)),
    sa.Column("kind", sa.String(8), nullable=False),
    sa.Column("units", sa.Integer, nullable=False),
    sa.Column("model", sa.Text),
    sa.Column("at", sa.Text, nullable=False),  # when the call was sent
    sa.Column("finished_at", sa.Text),  # when its reply came; NULL: outcome unknown
    # Usage as the endpoint reported it (NULL: not reported), the price applied (JSON, NULL:
    # the model has none), the worst case reserved before it was sent and the cost settled
    # from the usage after, in micro-units (docs/DESIGN.md#money-budgets). A call never
    # settled (failed, or its outcome unknown) keeps its reservation as what it spent.
    sa.Column("input_tokens", sa.Integer),
    sa.Column("output_tokens", sa.Integer),
    sa.Column("cached_input_tokens", sa.Integer),
    sa.Column("price", sa.Text),
    sa.Column("reserved_micros", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    sa.Column("cost_micros", sa.BigInteger),
)
sa.Index(
    "ix_provider_call_key",
    provider_call.c.project_id,
    provider_call.c.episode_id,
    provider_call.c.step_id,
)

# The spend cap's count (docs/DESIGN.md#spend-cap): one row per episode, the number of its
# provider_call rows, kept in the transaction that inserts each. A call is reserved by a
# conditional UPDATE of this row (calls < cap), so two steps of one episode never both
# take its last call.
episode_calls = sa.Table(
    "episode_calls",
    metadata,
    sa.Column("project_id", sa.String(64), primary_key=True),
    sa.Column("episode_id", sa.String(64), primary_key=True),
    sa.Column("calls", sa.Integer, nullable=False),
    # The calls its story was estimated at when registered (NULL: none known).
    sa.Column("estimated", sa.Integer),
    # Money spent or reserved by its calls, micro-units (docs/DESIGN.md#money-budgets): a
    # call's worst case added before it is sent (a conditional UPDATE under the episode's
    # money budget), its real cost put in its place when it is settled.
    sa.Column("cost_micros", sa.BigInteger, nullable=False, server_default=sa.text("0")),
)

# Per project and UTC day, kept by every call in the transaction that records it: money spent
# or reserved (micro-units; the project-day budget's counter, kept like
# ``episode_calls.cost_micros``), the calls, and those that had a price. ``status`` reads a
# project's spend from these rows (a few per project), never from its calls.
project_day_spend = sa.Table(
    "project_day_spend",
    metadata,
    sa.Column("project_id", sa.String(64), primary_key=True),
    sa.Column("day", sa.String(10), primary_key=True),  # YYYY-MM-DD, UTC
    sa.Column("cost_micros", sa.BigInteger, nullable=False),
    sa.Column("calls", sa.BigInteger, nullable=False, server_default=sa.text("0")),
    sa.Column("priced", sa.BigInteger, nullable=False, server_default=sa.text("0")),
)

# The judge's limits shared by the sensor daemon and every run worker: one row
# per setting in force from the ledger (a PIPELINE_* variable still overrides it per process).
settings = sa.Table(
    "settings",
    metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
    sa.Column("updated_by", sa.Text, nullable=False),
)

# Every change of a setting: who, when, from what to what (old NULL: the key was unset).
setting_change = sa.Table(
    "setting_change",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("key", sa.String(64), nullable=False),
    sa.Column("old_value", sa.Text),
    sa.Column("new_value", sa.Text, nullable=False),
    sa.Column("changed_at", sa.Text, nullable=False),
    sa.Column("changed_by", sa.Text, nullable=False),
)

# Previous commit pointers of a step on object storage (the local store's ``archive/``): a
# publish that replaces a pointer keeps the old one here, in the same transaction, and the
# newest ``keep_archives`` per step are kept. Garbage collection keeps every object that a
# current or archived pointer names.
checkpoint_archive = sa.Table(
    "checkpoint_archive",
    metadata,
    sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    ),
    sa.Column("project_id", sa.String(64), nullable=False),
    sa.Column("episode_id", sa.String(64), nullable=False),
    sa.Column("step_id", sa.String(64), nullable=False),
    sa.Column("pointer", sa.Text, nullable=False),
    sa.Column("reason", sa.String(32), nullable=False),
    sa.Column("run_id", sa.String(128)),  # who replaced it
    sa.Column("archived_at", sa.Text, nullable=False),
)
sa.Index(
    "ix_checkpoint_archive_key",
    checkpoint_archive.c.project_id,
    checkpoint_archive.c.episode_id,
    checkpoint_archive.c.step_id,
)

# Run leases (docs/DESIGN.md#run-leases): the coordinator of a run (the process that hands
# its steps out: a run worker, ``storyboard materialize``) renews its row while it lives and
# ends it when it finishes, so a run whose coordinator died is told from one whose steps
# merely wait, whatever rows it holds.
run_lease = sa.Table(
    "run_lease",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),  # the Dagster run id
    sa.Column("started_at", sa.Text, nullable=False),
    sa.Column("heartbeat_at", sa.Text, nullable=False),
    sa.Column("ended_at", sa.Text),  # NULL: the coordinator has not said it finished
    sa.Column("worker", sa.String(160), nullable=False),  # host:pid of the coordinator
)

# The shared rate limit (docs/DESIGN.md#rate-limit): one row per endpoint (base_url) and
# model, the GCRA state every process reserves its calls from under the row lock
# (resources.ledger.gcra). Seconds on the ledger's clock (PostgreSQL's, SQLite's host's),
# not ISO text: only ever compared with the same clock, in the same transaction.
rate_limit = sa.Table(
    "rate_limit",
    metadata,
    sa.Column("endpoint", sa.String(512), primary_key=True),
    sa.Column("model", sa.String(256), primary_key=True),
    sa.Column("request_at", sa.Double, nullable=False),
    sa.Column("token_at", sa.Double, nullable=False),
    sa.Column("paused_until", sa.Double, nullable=False),
    sa.Column("updated_at", sa.Text, nullable=False),
)

# A step waiting for the rate limit now (what ``storyboard status`` shows): written when its
# wait starts, deleted when its call goes. ``until`` is the waiter's estimate, ISO text.
rate_wait = sa.Table(
    "rate_wait",
    metadata,
    sa.Column("project_id", sa.String(64), primary_key=True),
    sa.Column("episode_id", sa.String(64), primary_key=True),
    sa.Column("step_id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(128)),
    sa.Column("endpoint", sa.String(512), nullable=False),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("until", sa.Text, nullable=False),
)
