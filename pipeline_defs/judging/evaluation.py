"""Batch evaluation of (step, partition) pairs with the single judge. Dagster-free.

The resume sensor and the CLI's shadow ``decide`` both call :func:`evaluate_partitions`:
every step of every given partition is judged by ``StepJudge.judge`` in resume mode
(never force) with ONE ledger query for all rows. A clean checkpoint whose seal still holds
(resources.checkpoints.seal: every file its run verified keeps its stat identity) is judged
from the seal; any other is read through the checkpoint store's identity cache and
verified only where the decision table needs it (``decide`` calls ``verify`` lazily).
Nothing here writes anywhere, by type: :class:`BatchJudge` takes :class:`ReadStores`, the
stores' readers (``steps.readers``); :class:`Stores` adds the full stores for the sensor's
writers (the scrub clears seals) and is a ``ReadStores`` for judging.

On top of the decision it says whether the sensor would launch now, and if not, why:

- ``launch``: RERUN_SELF / STALE_RUNNING_RECOVERY, no backoff, and every upstream step
  either settled or launched in the same run (``after`` names those);
- ``deferred``: launchable but ``retry_not_before`` is in the future (table row 13);
- ``waiting``: launchable but an upstream step (transitively, same partition) is deferred,
  waiting, running or blocked, so it is not in this tick's run;
- ``blocked`` / ``skip`` / ``not_applicable``: the judge's own verdict (exhausted
  recoveries are blocks with code ``step.recovery_exhausted``).

A partition whose judging meets an outage (``errors.OUTAGES``: the storage or the ledger
out of reach, its retries spent) gets no verdict at all: the outage says nothing of its
steps. The batch judge leaves it out of its answer and names it in ``outages``; the tick
defers it whole (nothing launched or reported, judged again next tick). Without
``defer_outages`` (``evaluate_partitions``: ``status``, ``decide``) the outage is raised.

The launches of a partition form ONE run (docs/DESIGN.md#sensor,
:class:`~pipeline_defs.judging.batch_verdicts.PartitionRun`): a settled step is never in it for
the sake of its upstream. A launch carries a run key derived from the steps, the partition
and the state that caused each decision (ledger row status / run_id / started_at /
updated_at / recovery_count / retry_not_before, checkpoint content hash and step-directory
identity), so the same decisions launch once until that state changes.
"""

import contextlib
import gc
import hashlib
import json
import posixpath
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import replace
from datetime import datetime

from pipeline_defs.judging.batch_verdicts import PartitionRun, SealedVerdicts
from pipeline_defs.judging.projects import ProjectCache
from pipeline_defs.judging.step_evaluation import (
    BLOCKED_UPSTREAM,
    JUDGED_COLUMNS,
    LAUNCH_ACTIONS,
    RUN_KEY_PREFIX,
    UNJUDGEABLE,
    Facts,
    Outage,
    PartitionRows,
    StepEvaluation,
    Verdict,
)
from pipeline_defs.judging.stores import PipelineLike, ReadStores, Stores
from pipeline_defs.resume.clock import as_utc
from pipeline_defs.resume.completion import Origin
from pipeline_defs.resume.decision_types import (
    CODE_ALREADY_RUNNING,
    CODE_RESUME_BLOCKED,
    CODE_VERIFY_CRASHED,
    LaunchMode,
    ResumeAction,
    ResumeDecision,
)
from pipeline_defs.resume.errors import OutageError, PipelineError
from pipeline_defs.resume.identity import (
    ABSENT,
    FileIdentity,
    Identity,
    directory_identity,
)
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from pipeline_defs.steps.graph import StepGraph, order_steps
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.spec import Step
from resources.checkpoints.seal import Seal, identity_of

# ----------------------------------------------------------------------------- the judge
_NOTED_LIMIT = 4096  # distinct sealed artifact tuples remembered (then forgotten at once)


def _unjudgeable(exc: BaseException) -> ResumeDecision:
    """The judge itself could not run (bad project file, bad partition key, a bug).

    The run would fail the same way; the sensor reports it as a block rather than crash
    the whole tick (typed error = contract drift, anything else = a crash). Never an
    outage: that defers the partition instead (``BatchJudge.outages``).
    """
    if isinstance(exc, PipelineError):
        return ResumeDecision(
            ResumeAction.BLOCK,
            f"{UNJUDGEABLE}: {exc.code}: {exc.message}",
            origin=Origin.CONTRACT_DRIFT,
            code=CODE_RESUME_BLOCKED,
        )
    return ResumeDecision(
        ResumeAction.BLOCK,
        f"judging crashed: {type(exc).__name__}: {exc}",
        origin=Origin.VERIFY_CRASHED,
        code=CODE_VERIFY_CRASHED,
    )


class BatchJudge:
    """Judges whole partitions (every step, dependency order) against preloaded rows.

    Keeps the per-step judges and the project-config cache between calls, so a long-lived
    owner (the sensor) pays for unchanged project files and envelopes only once.
    """

    def __init__(
        self,
        steps: Sequence[Step],
        stores: ReadStores,
        *,
        trust_seals: bool = True,
        defer_outages: bool = True,
    ) -> None:
        self.steps = order_steps(steps)
        # Seals let a clean, unchanged checkpoint be judged from stat calls alone; off, every
        # envelope is read and verified (resources.checkpoints.seal).
        self.trust_seals = trust_seals
        # An outage met while judging a partition defers it (left out of the answer, named
        # in ``outages`` for the last ``evaluate``); False: the outage is raised.
        self.defer_outages = defer_outages
        self.outages: dict[str, Outage] = {}
        self._shared: dict[str, FileIdentity | None] = {}
        self.stores = stores
        graph = StepGraph(self.steps)
        self.upstream = graph.upstream_closure()
        self.projects = ProjectCache(stores.checkpoints.home)
        # The same judge a run calls (same inputs, same decision), sharing the cache.
        self.judges = {
            s.step_id: StepJudge(
                s,
                graph=graph,
                settings=stores.settings,
                ledger=stores.ledger,
                checkpoints=stores.checkpoints,
                projects=self.projects,
            )
            for s in self.steps
        }
        self.judged = 0  # judge calls so far (instrumentation, timing-free)
        self._verdicts = SealedVerdicts()  # holding seals: each distinct state judged once
        # Sub-directories (relative to the step directory) that hold artifacts, per step:
        # a file deleted there changes that directory's mtime, not the step directory's.
        self.artifact_dirs: dict[str, set[str]] = {}
        self._noted: set[tuple[str, tuple[str, ...]]] = set()  # sealed artifacts noted

    @property
    def step_ids(self) -> tuple[str, ...]:
        return tuple(s.step_id for s in self.steps)

    def load_rows(self, partition_keys: Iterable[str]) -> dict[StepKey, LedgerRow]:
        """ONE ledger query for every row of these partitions and steps."""
        episodes = [e for e in (_episode(pk) for pk in partition_keys) if e is not None]
        if not episodes:
            return {}
        return self.stores.ledger.get_many(
            episodes=episodes, step_ids=self.step_ids, columns=JUDGED_COLUMNS
        )

    def evaluate(
        self,
        partition_keys: Iterable[str],
        now: datetime,
        rows: Mapping[StepKey, LedgerRow],
        directories: Callable[[str, str], Identity] | None = None,
        *,
        keep_skips: Container[str] | None = None,
        grouped: Mapping[str, PartitionRows] | None = None,
    ) -> list[StepEvaluation]:
        """Judge every step of every partition; ``rows`` must hold all their ledger rows.

        ``keep_skips``: return SKIPs only for these slots (``step|partition``): a tick acts
        on nothing else, and a cold tick would otherwise build 100,000 of them.
        ``grouped``: ``rows_by_partition(rows)``, when the caller judges ``rows`` in slices.
        A partition whose judging met an outage is left out and named in ``outages``.
        """
        now = as_utc(now)
        self.outages = {}
        self.projects.refresh()
        self._shared.clear()
        self._verdicts.clear()
        where = directories or self._directory
        by_pk = rows_by_partition(rows) if grouped is None else grouped
        out: list[StepEvaluation] = []
        try:
            with gc_paused(), self.stores.checkpoints.judging_scope():
                for pk in partition_keys:
                    out.extend(self._partition(pk, now, by_pk.get(pk), where, keep_skips))
        finally:
            self._shared.clear()  # input identities are only valid for this evaluation
        return out

    def _sealed(self, key: StepKey, row: LedgerRow | None) -> Seal | None:
        """The row's seal when it still holds (then the checkpoint is not read at all)."""
        if not self.trust_seals or row is None or row.status is not StepStatus.COMPLETED:
            return None
        text = row.checkpoint_seal
        if not text:
            return None
        seal = self.stores.checkpoints.sealed(key, text, self._shared_identity)
        if seal is None or seal.revision != self.judges[key.step_id].step.verify_revision:
            return None  # verified by another revision of the step's verifier
        return seal

    def _shared_identity(self, path: str) -> FileIdentity | None:
        """Stat of a project/episode input, once per evaluation (every step shares them)."""
        try:
            return self._shared[path]
        except KeyError:
            found = self._shared[path] = identity_of(path)
            return found

    def _note_artifact_dirs(self, step_id: str, paths: Iterable[str]) -> None:
        known = self.artifact_dirs.setdefault(step_id, set())
        for path in paths:
            parent = posixpath.dirname(posixpath.normpath(path))
            if parent and parent not in known and not parent.startswith(".."):
                known.add(parent)

    def _note_sealed_artifacts(self, step_id: str, paths: tuple[str, ...]) -> None:
        # Seals of one step name the same few artifact paths over and over: each distinct
        # tuple is noted once (a set lookup instead of a normpath per path and row).
        slot = (step_id, paths)
        if slot in self._noted:
            return
        if len(self._noted) >= _NOTED_LIMIT:
            self._noted.clear()
        self._noted.add(slot)
        self._note_artifact_dirs(step_id, paths)

    def _directory(self, pk: str, step_id: str) -> Identity:
        episode = _episode(pk)
        if episode is None:
            return ABSENT
        layout = self.stores.checkpoints.scan_layout  # what the tick watches, as it scans it
        return directory_identity(layout.step_dir(episode.project_id, episode.episode_id, step_id))

    def _partition(
        self,
        pk: str,
        now: datetime,
        rows: PartitionRows | None,
        directories: Callable[[str, str], Identity],
        keep_skips: Container[str] | None = None,
    ) -> list[StepEvaluation]:
        """``rows``: the partition's ledger rows by step id (None: it has none)."""
        episode = _episode(pk)
        done: dict[str, StepEvaluation] = {}
        settled: dict[str, bool] = {}
        # What each step's decision was made from: the row and the checkpoint version (or
        # breakage) judged. Its ``Facts`` are built only for an evaluation that is kept (a
        # SKIP that clears no block is not, nor is its upstream then): a cold tick of
        # 100,000 sealed SKIPs built and dropped 100,000 of them (4 % of its CPU under
        # cProfile, with the scan lookup each needs; benchmarks/sensor_tick.py, 10,000).
        observed: dict[str, tuple[LedgerRow | None, str | None]] = {}
        facts: dict[str, Facts] = {}

        def facts_of(step_id: str) -> Facts:
            found = facts.get(step_id)
            if found is None:
                row, seen = observed[step_id]
                found = facts[step_id] = Facts.observe(row, seen, directories(pk, step_id))
            return found

        # A SKIP is dropped unless its slot clears a reported block (none on most ticks).
        drop_skips = keep_skips is not None
        skips_kept = None if isinstance(keep_skips, Sized) and not keep_skips else keep_skips
        upstream = self.upstream
        run = PartitionRun()  # the steps this tick's one run of the partition holds
        for step in self.steps:
            step_id = step.step_id
            row: LedgerRow | None = None
            seen: str | None = None  # which checkpoint version (or breakage) was judged
            try:
                found = rows.get(step_id) if rows is not None else None
                if found is None:
                    key = (episode or Episode.parse(pk)).step(step_id)  # a bad key raises, typed
                else:
                    key, row = found  # the store's own key: not built (and validated) again
                judge = self.judges[step_id]
                self.judged += 1
                sealed = self._sealed(key, row)
                if sealed is not None:
                    seen = sealed.version
                    if sealed.artifacts:
                        self._note_sealed_artifacts(step_id, sealed.artifacts)
                    assert row is not None  # a seal is only taken from a completed row
                    decision = self._verdicts.decide(judge, key, row, now, sealed)
                else:
                    checkpoint, broken = judge.load_checkpoint(key)
                    if broken is not None:
                        seen = f"broken:{broken.code}:{broken.message}"
                    elif checkpoint is not None:
                        seen = checkpoint.version
                        self._note_artifact_dirs(step_id, [a.path for a in checkpoint.artifacts])
                    decision = judge.judge(
                        key, mode=LaunchMode.RESUME, row=row, now=now, loaded=(checkpoint, broken)
                    ).decision
            except Exception as exc:  # one bad partition must not sink the tick
                if isinstance(exc, OutageError):
                    # No verdict on any of its steps (docs/DESIGN.md#sensor): the
                    # partition is deferred whole, and judged again next tick.
                    if not self.defer_outages:
                        raise
                    self.outages[pk] = Outage.of(exc)
                    return []
                decision = _unjudgeable(exc)
            observed[step_id] = (row, seen)
            if decision.action is ResumeAction.SKIP:
                # Settled: no waits, never in the run (_verdict's first case).
                settled[step_id] = True
                if drop_skips and (skips_kept is None or f"{step_id}|{pk}" not in skips_kept):
                    continue
                waits: tuple[str, ...] = ()
                verdict, detail = Verdict.SKIP, _SKIP_DETAIL
            else:
                waits = tuple(u for u in upstream[step_id] if not settled.get(u))
                verdict, detail = _verdict(decision, waits, run.outside(waits), done)
                settled[step_id] = verdict is Verdict.NOT_APPLICABLE and seen is not None
                if verdict is Verdict.LAUNCH:
                    run.join(step_id)
                elif verdict is Verdict.NOT_APPLICABLE and seen is None:
                    run.offer(step_id, waits)
            done[step_id] = StepEvaluation(
                step_id=step_id,
                partition_key=pk,
                decision=decision,
                verdict=verdict,
                detail=detail,
                facts=facts_of(step_id),
                waits_on=waits if verdict is Verdict.WAITING else (),
                upstream=tuple(facts_of(u) for u in upstream[step_id]),
                after=waits if verdict is Verdict.LAUNCH else (),
            )
        return _one_run(pk, done, run)


def rows_by_partition(
    rows: Mapping[StepKey, LedgerRow],
) -> dict[str, dict[str, tuple[StepKey, LedgerRow]]]:
    """``rows`` by partition key, then step id: grouped once per tick, so judging a
    partition builds no key and hashes none per step to find its rows (a cold tick over
    10,000 episodes built 100,000 ``StepKey`` objects for that)."""
    grouped: dict[str, dict[str, tuple[StepKey, LedgerRow]]] = {}
    for key, row in rows.items():
        pk = key.partition_key
        part = grouped.get(pk)
        if part is None:
            part = grouped[pk] = {}
        part[key.step_id] = (key, row)
    return grouped


def _one_run(pk: str, done: dict[str, StepEvaluation], run: PartitionRun) -> list[StepEvaluation]:
    """The partition's launches as one run: the not-applicable steps it must record join
    it, and a run of several steps gets one run key (docs/DESIGN.md#sensor)."""
    launched = [ev for ev in done.values() if ev.verdict is Verdict.LAUNCH]
    if not launched:
        return list(done.values())
    for step_id, waits in run.recorded(u for ev in launched for u in ev.after).items():
        done[step_id] = replace(
            done[step_id],
            verdict=Verdict.LAUNCH,
            detail="recorded as not applicable by the partition's run (a step of it needs that)",
            after=waits,
        )
    members = [ev for ev in done.values() if ev.verdict is Verdict.LAUNCH]  # dependency order
    if len(members) > 1:
        # Every member's state (its own facts and its upstream's) is in the digest: the
        # same decisions give the same key (Dagster launches it once), any change a new one.
        payload = json.dumps([[ev.step_id, ev.state] for ev in members])
        digest = hashlib.sha256(payload.encode("utf-8")).hexdigest()[:20]
        key = f"{RUN_KEY_PREFIX}:{members[0].step_id}+{len(members) - 1}:{pk}:{digest}"
        for ev in members:
            done[ev.step_id] = replace(ev, run=key)
    return list(done.values())


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while judging a big batch.

    Judging allocates many short-lived, acyclic objects next to a large envelope cache;
    each full collection would walk that whole cache (measured: a third of the CPU of a
    cold tick over 100,000 envelopes). Reference counting still frees everything.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _episode(pk: str) -> Episode | None:
    try:
        return Episode.parse(pk)
    except PipelineError:
        return None


_SKIP_DETAIL = "nothing to do"


def _verdict(
    decision: ResumeDecision,
    waits: tuple[str, ...],
    outside: tuple[str, ...],
    done: Mapping[str, StepEvaluation],
) -> tuple[Verdict, str]:
    """``waits``: the unsettled upstream steps; ``outside``: those not in the partition's run."""
    action = decision.action
    if action is ResumeAction.SKIP:
        return Verdict.SKIP, _SKIP_DETAIL
    if action is ResumeAction.NOT_APPLICABLE:
        # Never a run of its own; a run recorded it, or records it when a step below needs it.
        return Verdict.NOT_APPLICABLE, "not applicable here; never launched for its own sake"
    if action is ResumeAction.BLOCK and decision.code == CODE_ALREADY_RUNNING:
        return Verdict.RUNNING, "running: another run holds a live lease; nothing to do"
    if action is ResumeAction.BLOCK:
        return Verdict.BLOCKED, f"blocked ({decision.code}); reported as a failed check"
    if action not in LAUNCH_ACTIONS:  # FORCE_EXPLICIT cannot come out of resume mode
        raise AssertionError(f"the sensor never acts on {action.value}")
    if decision.deferred_until is not None:
        return Verdict.DEFERRED, f"backoff: retry not before {decision.deferred_until}"
    if outside:
        blocked = [u for u in outside if u in done and done[u].verdict is Verdict.BLOCKED]
        if blocked:  # what holds it is the block, not its own reason
            return Verdict.WAITING, f"{BLOCKED_UPSTREAM} {', '.join(blocked)}"
        listed = ", ".join(f"{u} ({done[u].verdict.value})" for u in outside if u in done)
        return Verdict.WAITING, f"waiting for upstream {listed}"
    if waits:
        return Verdict.LAUNCH, f"launch {action.value}, in one run after {', '.join(waits)}"
    return Verdict.LAUNCH, f"launch {action.value}"


# ----------------------------------------------------------------------------- public API
def evaluate_partitions(
    steps: Sequence[Step],
    pipeline_resource_or_stores: "ReadStores | PipelineLike",
    partition_keys: Iterable[str],
    now: datetime,
    *,
    rows: Mapping[StepKey, LedgerRow] | None = None,
) -> list[StepEvaluation]:
    """What the resume sensor would do now for every step of these partitions.

    One ledger query (unless ``rows`` is given), reads only, resume mode only. Results are
    ordered by partition (as given) then by step in dependency order. An outage met while
    judging is raised (a view has nothing true to show of what it could not read).
    """
    source = pipeline_resource_or_stores
    stores = source if isinstance(source, ReadStores) else Stores.of(source)
    judge = BatchJudge(steps, stores, defer_outages=False)
    keys = list(dict.fromkeys(partition_keys))
    loaded = judge.load_rows(keys) if rows is None else rows
    return judge.evaluate(keys, now, loaded)
