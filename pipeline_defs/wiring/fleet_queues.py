"""A run's coordinator watches that some worker consumes the queues its steps wait on.

dagster-celery sends a step to its queue and waits for its result; a queue no worker
consumes (a worker started with another ``--queue``, an op's ``dagster-celery/queue`` tag
naming a queue nobody serves, every worker gone) would leave the run waiting for ever,
silently. :class:`FleetExecutor` runs dagster-celery's execution loop with a submit of its
own that watches each step's result (:class:`WatchedResult`): while a step is pending, the
workers are asked which queues they consume (``active_queues``, in a thread of its own so a
slow or cut broker never holds the loop; an unanswered probe counts as "unknown", never as
"none"). A queue that no answering worker consumes gets a warning in the run's event log
naming it and the command that starts a worker for it, and a run tag
(``UNSERVED_QUEUE_TAG``) ``storyboard status`` reads; once it has gone unconsumed for
``PIPELINE_CELERY_QUEUE_WAIT_SECONDS`` by every probe in between, its steps fail and the run
fails with ``fleet.queue_unserved`` naming the queue (docs/DESIGN.md#fleet).
"""

import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from celery.exceptions import DuplicateTaskNameWarning
from dagster_celery.config import TASK_EXECUTE_PLAN_NAME
from dagster_celery.executor import CeleryExecutor, _submit_task

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.fleet_settings import (
    QUEUE_WAIT_ENV,
    UNSERVED_QUEUE_TAG,
    FleetSettings,
    masked,
    worker_command,
)
from pipeline_defs.wiring.fleet_loop import fleet_execution_loop

_log = logging.getLogger(__name__)

PROBE_TIMEOUT_SECONDS = 1.0  # how long a probe collects the workers' answers
MAX_PROBE_INTERVAL_SECONDS = 10.0


@dataclass(frozen=True)
class Observation:
    """One probe: when it was asked, and the queues the answering workers consume (None: no
    answer could be had, the broker unreachable or the probe failed)."""

    asked_at: float
    consumed: frozenset[str] | None


class QueueProbe:
    """Asks the broker's workers which queues they consume, one probe at a time, each in a
    daemon thread: the caller reads the latest observation and never waits on the broker."""

    def __init__(
        self, app: Any, *, timeout: float = PROBE_TIMEOUT_SECONDS, clock: Callable[[], float]
    ) -> None:
        self._app = app
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._latest: Observation | None = None

    def ask(self) -> None:
        """Start a probe unless one is still out."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            thread = threading.Thread(
                target=self._probe, args=(self._clock(),), name="queue-probe", daemon=True
            )
            self._thread = thread
        thread.start()

    def latest(self) -> Observation | None:
        with self._lock:
            return self._latest

    def _probe(self, asked_at: float) -> None:
        consumed: frozenset[str] | None = None
        try:
            with self._app.connection_for_write() as connection:
                connection.ensure_connection(max_retries=1, timeout=self._timeout)
                inspect = self._app.control.inspect(timeout=self._timeout, connection=connection)
                replies = inspect.active_queues() or {}
            consumed = frozenset(
                str(queue["name"])
                for queues in replies.values()
                for queue in queues or ()
                if isinstance(queue, dict) and "name" in queue
            )
        except Exception as exc:  # the broker's transport raises its own errors
            _log.info("queue probe unanswered (%s: %s)", type(exc).__name__, exc)
        with self._lock:
            self._latest = Observation(asked_at, consumed)


@dataclass
class _Waiting:
    """A queue with steps of this run pending on it."""

    since: float  # when the first of them was sent
    steps: set[str] = field(default_factory=set)
    unserved_since: float | None = None  # the first probe of the current "none" streak
    unserved_until: float | None = None  # the latest probe of that streak
    warned: bool = False


class QueueWatch:
    """The queues one run's pending steps wait on, judged from the probes' observations."""

    def __init__(
        self,
        settings: FleetSettings,
        *,
        warn: Callable[[str], None],
        info: Callable[[str], None],
        tag: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.wait_seconds = settings.queue_wait_seconds
        self.probe_every = min(MAX_PROBE_INTERVAL_SECONDS, max(0.5, self.wait_seconds / 4))
        self._warn = warn
        self._info = info
        self._tag = tag
        self._clock = clock
        self._probe: QueueProbe | None = None
        self._asked = float("-inf")
        self._seen: Observation | None = None
        self._waiting: dict[str, _Waiting] = {}
        self.error: PipelineError | None = None  # the first typed error a step failed with

    def bind(self, app: Any) -> None:
        if self._probe is None:
            self._probe = QueueProbe(app, clock=self._clock)

    def sent(self, queue: str, step_key: str) -> None:
        waiting = self._waiting.setdefault(queue, _Waiting(since=self._clock()))
        waiting.steps.add(step_key)
        self.poll()

    def finished(self, queue: str, step_key: str, *, served: bool) -> None:
        """``step_key`` is no longer pending: a worker ran it (``served``) or it gave up."""
        waiting = self._waiting.get(queue)
        if waiting is None:
            return
        waiting.steps.discard(step_key)
        was_warned = waiting.warned
        if served and waiting.warned:  # the probe had not seen the worker yet: it came
            waiting.warned = False
            self._info(self._served_text(queue))
        if not waiting.steps:
            del self._waiting[queue]
        if was_warned:
            self._update_tag()

    def poll(self) -> None:
        """Ask again when due, and take in the latest answer."""
        if self._probe is None or not self._waiting:
            return
        now = self._clock()
        if now - self._asked >= self.probe_every:
            self._asked = now
            self._probe.ask()
        seen = self._probe.latest()
        if seen is None or seen is self._seen:
            return
        self._seen = seen
        changed = False
        for queue, waiting in self._waiting.items():
            if seen.asked_at < waiting.since:
                continue  # asked before this queue's step was sent
            if seen.consumed is None:  # no answer: nothing is known, no streak goes on
                waiting.unserved_since = waiting.unserved_until = None
            elif queue in seen.consumed:
                waiting.unserved_since = waiting.unserved_until = None
                if waiting.warned:
                    waiting.warned, changed = False, True
                    self._info(self._served_text(queue))
            else:
                if waiting.unserved_since is None:
                    waiting.unserved_since = seen.asked_at
                waiting.unserved_until = seen.asked_at
                if not waiting.warned:
                    waiting.warned, changed = True, True
                    self._warn(self._unserved_text(queue, waiting))
        if changed:
            self._update_tag()

    def expired(self, queue: str) -> PipelineError | None:
        """``fleet.queue_unserved`` once every probe over the wait found no consumer."""
        waiting = self._waiting.get(queue)
        if waiting is None or waiting.unserved_since is None or waiting.unserved_until is None:
            return None
        if waiting.unserved_until - waiting.unserved_since < self.wait_seconds:
            return None
        steps = ", ".join(sorted(waiting.steps))
        error = PipelineError(
            ErrorCode.FLEET_QUEUE_UNSERVED,
            f"no worker consumed Celery queue '{queue}' for {self.wait_seconds:g}s "
            f"({QUEUE_WAIT_ENV}) while step(s) {steps} waited on it (the workers of "
            f"{masked(self.settings.broker_url)} were asked): start one with "
            f"`{worker_command(queue)}` and launch the run again",
            details={"queue": queue},
        )
        self.record(error)
        return error

    def record(self, error: PipelineError) -> None:
        if self.error is None:
            self.error = error

    def _unserved_text(self, queue: str, waiting: _Waiting) -> str:
        return (
            f"step(s) {', '.join(sorted(waiting.steps))} wait on Celery queue '{queue}', "
            f"which no worker consumes (the workers of {masked(self.settings.broker_url)} "
            f"were asked): start one with `{worker_command(queue)}` (with this deployment's "
            f"PIPELINE_* and DAGSTER_* settings); the run fails if none consumes it within "
            f"{self.wait_seconds:g}s ({QUEUE_WAIT_ENV})"
        )

    @staticmethod
    def _served_text(queue: str) -> str:
        return f"a worker now consumes Celery queue '{queue}': its steps go on"

    def _update_tag(self) -> None:
        unserved = sorted(q for q, w in self._waiting.items() if w.warned)
        self._tag(",".join(unserved))


class WatchedResult:
    """dagster-celery's ``AsyncResult`` of one step, as its loop reads it (``ready``,
    ``get``, ``revoke``), with the step's queue watched while it is pending."""

    def __init__(self, inner: Any, watch: QueueWatch, queue: str, step_key: str) -> None:
        self.inner = inner
        self.watch = watch
        self.queue = queue
        self.step_key = step_key
        self._failed: PipelineError | None = None

    def ready(self) -> bool:
        if self._failed is not None:
            return True
        if self.inner.ready():
            self.watch.finished(self.queue, self.step_key, served=True)
            return True
        self.watch.poll()
        error = self.watch.expired(self.queue)
        if error is None:
            return False
        self._failed = error
        self.watch.finished(self.queue, self.step_key, served=False)
        try:  # a worker that comes later is told not to run it (best effort)
            self.inner.revoke()
        except Exception as exc:
            _log.info("revoking step %s: %s", self.step_key, exc)
        return True

    def get(self) -> Any:
        if self._failed is not None:
            raise self._failed
        try:
            return self.inner.get()
        except PipelineError as error:  # a worker's typed refusal (fleet_tasks)
            self.watch.record(error)
            raise

    def revoke(self) -> None:
        self.inner.revoke()

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


class FleetExecutor(dg.Executor):
    """dagster-celery's executor (composition: its app and retries; its loop with a short
    poll tick, ``fleet_loop``), its steps' queues watched; a run that fails on a typed error
    of the fleet fails with that error."""

    def __init__(self, inner: CeleryExecutor, settings: FleetSettings) -> None:
        self.inner = inner
        self.settings = settings

    @property
    def retries(self) -> Any:
        return self.inner.retries

    def app_args(self) -> Any:
        return self.inner.app_args()  # type: ignore[no-untyped-call]

    def execute(self, plan_context: Any, execution_plan: Any) -> Iterator[dg.DagsterEvent]:
        instance, run_id = plan_context.instance, plan_context.run_id

        def tag(value: str) -> None:
            try:
                instance.add_run_tags(run_id, {UNSERVED_QUEUE_TAG: value})
            except Exception as exc:  # a note for status only: never the run's failure
                _log.warning("run %s: tag %s not written: %s", run_id, UNSERVED_QUEUE_TAG, exc)

        log = plan_context.log
        watch = QueueWatch(self.settings, warn=log.warning, info=log.info, tag=tag)

        def submit(
            app: Any, context: Any, step: Any, queue: str, priority: int, known_state: Any
        ) -> WatchedResult:
            watch.bind(app)
            with warnings.catch_warnings():
                # dagster-celery registers its step task on the run's app again for every
                # step it sends (a new closure under the same name): Celery warns from the
                # second step on. The task sent is the one registered first, the same code.
                warnings.filterwarnings(
                    "ignore",
                    message=f"Task name '{TASK_EXECUTE_PLAN_NAME}' is already registered",
                    category=DuplicateTaskNameWarning,
                )
                result = _submit_task(app, context, step, queue, priority, known_state)  # type: ignore[no-untyped-call]
            watched = WatchedResult(result, watch, queue, step.key)
            watch.sent(queue, step.key)
            return watched

        try:
            yield from fleet_execution_loop(plan_context, execution_plan, step_execution_fn=submit)
        except Exception as exc:
            if watch.error is None:
                raise
            raise watch.error from exc
