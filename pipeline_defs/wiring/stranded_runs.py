"""Launches stranded by an infrastructure failure, launched again (docs/DESIGN.md#stranded-runs).

A run the sensor requested can fail before it changes any ledger row: the broker or the
result backend is down, Dagster's storage refuses a write. The partition is then judged the
same way on the next tick, to the same run key, and Dagster launches a run key once: the
episode said "launch now" for ever with nothing launched. So when every run of a launch's
run key (and of its earlier attempts) ended FAILURE or CANCELED, the same judgement is
launched again under a key of its own (``<run key>:again<n>``) once its backoff has passed
(``retry_backoff_seconds`` times n after the last one ended), at most ``max_recovery_attempts``
times; past that the partition waits for a change (an operator's launch, an edit) and the
sensor says so, naming the failure and the command: in its log, and as a failed
``resume_integrity`` check on the steps of that launch (:func:`stranded_reports`), passed
once the partition is judged again and launched or changed. A failure that changed a row
changes the judgement, hence the run key: that is a step's recovery, counted by the ledger,
not here.
"""

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import dagster as dg

from pipeline_defs.judging.step_evaluation import StepEvaluation
from pipeline_defs.resume.settings import ResumeSettings

RUN_KEY_TAG = "dagster/run_key"
AGAIN = ":again"
_FAILED = (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


@dataclass(frozen=True)
class Exhausted:
    """A launch whose attempts all failed before they changed anything: it waits for a change."""

    partition: str
    run_key: str  # the judgement's run key (its attempts add ``:again<n>``)
    steps: tuple[str, ...]  # the steps of the launch, dependency order
    failure: str  # how its runs ended
    command: str  # what launches it now

    @property
    def why(self) -> str:
        """The failure and the way out, as the sensor's log says it."""
        return (
            f"{self.partition}: {self.failure}; launched again once something changes, or "
            f"now with: {self.command}"
        )

    @property
    def signature(self) -> str:
        """Which launch is stranded: reported again only for another one."""
        return hashlib.sha256(self.run_key.encode("utf-8")).hexdigest()[:12]


@dataclass
class StrandedLaunches:
    """One tick's view of the launches whose earlier runs failed having changed nothing."""

    instance: dg.DagsterInstance
    settings: ResumeSettings
    now: float  # epoch seconds
    keys: dict[str, str] = field(default_factory=dict)  # run key → the key to request now
    exhausted: dict[str, Exhausted] = field(default_factory=dict)  # by partition

    def attempt_keys(self, run_key: str) -> list[str]:
        return [run_key] + [
            f"{run_key}{AGAIN}{n}" for n in range(1, self.settings.max_recovery_attempts + 1)
        ]

    def holds(self, launches: Sequence[StepEvaluation]) -> Mapping[str, float | None]:
        """The partitions whose launch waits: partition → when to look again, or None."""
        held: dict[str, float | None] = {}
        steps: dict[tuple[str, str], list[str]] = {}
        for ev in launches:  # dependency order
            if ev.run_key:
                steps.setdefault((ev.run_key, ev.partition_key), []).append(ev.step_id)
        for (run_key, pk), members in sorted(steps.items()):
            waits, until = self._judge(run_key, pk, tuple(members))
            if waits:
                held[pk] = until
        return held

    def _judge(self, run_key: str, pk: str, steps: tuple[str, ...]) -> tuple[bool, float | None]:
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
            self.exhausted[pk] = Exhausted(
                partition=pk,
                run_key=run_key,
                steps=steps,
                failure=(
                    f"its launch failed {attempts} times before it changed anything (last: run "
                    f"{last.dagster_run.run_id}, {last.dagster_run.status.value})"
                ),
                command=f"storyboard materialize --partition {pk}",
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


def _report(
    step_id: str, pk: str, passed: bool, description: str, **metadata: str
) -> dict[str, object]:
    return {
        "step_id": step_id,
        "partition": pk,
        "passed": passed,
        "description": description[:1000],
        "metadata": metadata,
    }


def stranded_reports(
    reported: Mapping[str, str] | None,
    exhausted: Mapping[str, Exhausted],
    judged: Collection[str],
    partitions: Collection[str],
    launched: Collection[str] = (),
    blocked: Collection[str] = (),
) -> tuple[list[dict[str, object]], dict[str, str]]:
    """(``resume_integrity`` reports for the ``resume_report`` run, the stranded launches
    reported after this tick: ``step|partition`` → the launch's signature).

    ``reported``: that map after the last tick (the sensor's cursor). A launch that is
    stranded (``exhausted``) and was not reported under its signature is reported failed on
    each of its steps, with the failure and the command. A reported one is passed once its
    partition was ``judged`` this tick and is no longer stranded (``launched`` again, or its
    state changed), except on a step reported ``blocked`` this tick (that report says what
    holds it now); a partition gone is forgotten.
    """
    before = dict(reported or {})
    after: dict[str, str] = {}
    reports: list[dict[str, object]] = []
    for slot, signature in sorted(before.items()):
        step_id, _, pk = slot.partition("|")
        if pk not in partitions:
            continue  # the partition is gone: nothing to show it on
        still = pk in exhausted and step_id in exhausted[pk].steps
        if still or pk not in judged:
            after[slot] = signature  # still stranded, or not judged again yet
            continue
        if slot in blocked:
            continue  # a block report on the same check says what holds it now
        how = "launched again" if pk in launched else "its state changed"
        reports.append(
            _report(
                step_id,
                pk,
                True,
                f"no longer a stranded launch: {how}",
                reason=f"the partition was judged again: {how}",
            )
        )
    for pk, stuck in sorted(exhausted.items()):
        for step_id in stuck.steps:
            slot = f"{step_id}|{pk}"
            if before.get(slot) != stuck.signature:
                reports.append(
                    _report(
                        step_id,
                        pk,
                        False,
                        f"launch stranded: {stuck.failure}; launched again once something "
                        f"changes, or now with: {stuck.command}",
                        reason=stuck.failure,
                        run_key=stuck.run_key,
                        what_to_do=(
                            f"{stuck.command} (or fix what failed the runs; the sensor "
                            "launches it again once something changes)"
                        ),
                    )
                )
            after[slot] = stuck.signature
    return reports, after
