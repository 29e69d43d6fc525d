"""Launches stranded by an infrastructure failure, launched again (docs/DESIGN.md#stranded-runs).

A run the sensor requested can fail before it changes any ledger row: the broker or the
result backend is down, Dagster's storage refuses a write. The partition is then judged the
same way on the next tick, to the same run key, and Dagster launches a run key once: the
episode said "launch now" for ever with nothing launched. So when every run of a launch's
run key (and of its earlier attempts) ended FAILURE or CANCELED, the same judgement is
launched again under a key of its own (``<run key>:again<n>``) once its backoff has passed
(``retry_backoff_seconds`` times n after the last one ended), at most ``max_recovery_attempts``
times; past that the partition waits for a change (an operator's launch, an edit) and the
sensor says so, naming the failure and the command. A failure that changed a row changes the
judgement, hence the run key: that is a step's recovery, counted by the ledger, not here.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import dagster as dg

from pipeline_defs.judging.step_evaluation import StepEvaluation
from pipeline_defs.resume.settings import ResumeSettings

RUN_KEY_TAG = "dagster/run_key"
AGAIN = ":again"
_FAILED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


@dataclass
class StrandedLaunches:
    """One tick's view of the launches whose earlier runs failed having changed nothing."""

    instance: dg.DagsterInstance
    settings: ResumeSettings
    now: float  # epoch seconds
    keys: dict[str, str] = field(default_factory=dict)  # run key → the key to request now
    exhausted: dict[str, str] = field(default_factory=dict)  # partition → why, and what to do

    def attempt_keys(self, run_key: str) -> list[str]:
        return [run_key] + [
            f"{run_key}{AGAIN}{n}" for n in range(1, self.settings.max_recovery_attempts + 1)
        ]

    def holds(self, launches: Sequence[StepEvaluation]) -> Mapping[str, float | None]:
        """The partitions whose launch waits: partition → when to look again, or None."""
        held: dict[str, float | None] = {}
        judged = {(ev.run_key, ev.partition_key) for ev in launches if ev.run_key}
        for run_key, pk in sorted(judged):
            waits, until = self._judge(run_key, pk)
            if waits:
                held[pk] = until
        return held

    def _judge(self, run_key: str, pk: str) -> tuple[bool, float | None]:
        """(whether the launch waits, until when: None for a change, attempts exhausted);
        a launch that does not wait is requested under ``keys[run_key]``."""
        records = list(
            self.instance.get_run_records(
                dg.RunsFilter(tags={RUN_KEY_TAG: self.attempt_keys(run_key)})
            )
        )
        if not records or any(r.dagster_run.status not in _FAILED for r in records):
            return False, None  # never launched, or in flight / succeeded: Dagster's dedupe
        attempts = len(records)
        last = max(records, key=lambda r: r.update_timestamp)
        if attempts > self.settings.max_recovery_attempts:
            self.exhausted[pk] = (
                f"{pk}: its launch failed {attempts} times before it changed anything (last: "
                f"run {last.dagster_run.run_id}, {last.dagster_run.status.value}); launched again "
                f"once something changes, or now with: storyboard materialize --partition {pk}"
            )
            return True, None
        self.keys[run_key] = f"{run_key}{AGAIN}{attempts}"
        ended = last.end_time or last.update_timestamp.timestamp()
        due = ended + self.settings.retry_backoff_seconds * attempts
        return self.now < due, due

    def key_for(self, run_key: str | None) -> str | None:
        """The run key to request for a launch judged to ``run_key``."""
        return None if run_key is None else self.keys.get(run_key, run_key)


# The last tick's time per sensor, in this process: the runs that failed since are looked up.
_LAST_LOOK: dict[str, datetime] = {}


def failed_since_last_tick(instance: dg.DagsterInstance, sensor_name: str) -> set[str]:
    """Partitions of this sensor's runs that ended FAILURE or CANCELED since its last tick in
    this process (none at the first: a new process judges every partition anyway). By the
    instance's clock, as the runs' records are (a second's overlap: a partition judged twice
    costs a judgement, one missed a relaunch)."""
    since = _LAST_LOOK.get(sensor_name)
    _LAST_LOOK[sensor_name] = datetime.now(UTC) - timedelta(seconds=1)
    if since is None:
        return set()
    ended = instance.get_run_records(
        dg.RunsFilter(
            statuses=list(_FAILED),
            tags={"dagster/sensor_name": sensor_name},
            updated_after=since,
        )
    )
    return {pk for r in ended if (pk := r.dagster_run.tags.get("dagster/partition"))}
