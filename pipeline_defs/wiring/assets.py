"""Turns step declarations into judged Dagster assets on the ``episodes`` partitions."""

import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import dagster as dg

from pipeline_defs.resume.causes import root_cause
from pipeline_defs.resume.decision_types import LaunchMode
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import ResumeSettings
from pipeline_defs.steps.accept import ACCEPTED, MANUAL, Accepted, accept_hand_edit, hand_edited
from pipeline_defs.steps.graph import StepGraph
from pipeline_defs.steps.judge import StepJudge
from pipeline_defs.steps.lease import coordinator_alive
from pipeline_defs.steps.redraw import REDRAW_TAG, parse_redraw
from pipeline_defs.steps.runner import RunInfo, StepOutcome, StepRunner
from pipeline_defs.steps.runner.recorded_verdicts import is_stop
from pipeline_defs.steps.spec import Markdown, Step, step_import_path
from pipeline_defs.wiring.io_manager import STEP_METADATA_KEY
from pipeline_defs.wiring.run_retries import stop_run_retries
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore
from resources.providers.base import MODEL_KINDS

episodes = dg.DynamicPartitionsDefinition(name="episodes")

RESUME_CHECK = "resume_integrity"
RESUME_CHECK_HELP = (
    "Whether this episode's step can resume as it is. Fails when the resume judge blocks it "
    "(origin, reason and the command to run are in the metadata; reported by resume_sensor "
    "through resume_report runs); passes when the step's run completes or the block clears."
)
MODE_TAG = "resume/mode"
LAUNCH_PATH_TAG = "resume/launch_path"
LAUNCH_PATH_MAX = 16  # width of step_transition.launch_path
IO_MANAGER_KEY = "checkpoint_io_manager"
GROUP = "storyboard"


# The values of ``resume/mode`` that ask for something; any other value resumes, as a run
# without the tag does (a typo never forces, and never accepts).
_TAGGED_MODES = {"force": LaunchMode.FORCE, "accept": LaunchMode.ACCEPT}


def launch_mode(tags: Mapping[str, str]) -> LaunchMode:
    """Explicit force is the run tag ``resume/mode=force``, keeping hand edits is
    ``resume/mode=accept`` (docs/DESIGN.md#hand-edits); nothing else produces either."""
    mode = _TAGGED_MODES.get(tags.get(MODE_TAG, "").strip().lower(), LaunchMode.RESUME)
    if mode is LaunchMode.ACCEPT and REDRAW_TAG in tags:
        # An accept publishes the edit as it stands; a redraw in the same run would draw
        # over it. Refused before anything is read, as a force with a redraw is.
        raise PipelineError(
            ErrorCode.REDRAW_INVALID,
            f"a launch is an accept ({MODE_TAG}=accept) or a redraw, not both",
        )
    return mode


def launch_path(tags: Mapping[str, str]) -> str:
    """Where a run came from, for the audit trail only; it never changes the decision.

    A free-text ``resume/launch_path`` tag is clamped to the audit column's width
    (``LAUNCH_PATH_MAX``) so an overlong tag can never fail a run after its claim.
    """
    if tags.get(LAUNCH_PATH_TAG, "").strip():
        return tags[LAUNCH_PATH_TAG].strip()[:LAUNCH_PATH_MAX]
    if "dagster/backfill" in tags:
        return "backfill"
    if "dagster/sensor_name" in tags:
        return "sensor"
    if tags.get("dagster/from_ui") == "true":
        return "ui"
    return "api"


ENDED_RUN_STATUSES = frozenset(
    {dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.SUCCESS}
)


def owner_run_id(owner: str) -> str | None:
    """The Dagster run id of an owner token (``<run id>:<attempt>``); None when the token
    names no Dagster run (an owner outside Dagster, such as a test's)."""
    run_id = owner.split(":", 1)[0]
    try:
        uuid.UUID(run_id)
    except ValueError:
        return None
    return run_id


def owner_ended_in(instance: dg.DagsterInstance) -> Callable[[str], str | None]:
    """Owner token (``<run id>:<attempt>``) -> how its run ended in ``instance``, or None.

    docs/DESIGN.md#dead-owners. Run monitoring marks a run whose worker died FAILURE; a run
    that ended while its row still says running holds a dead lease: its terminal status
    (``FAILURE``, ``CANCELED``, ``SUCCESS``). None when the owner may be alive, and the lease
    rules (its heartbeat alone) apply: its run is not terminal; this instance does not know
    the run (another deployment's Dagster instance on the same ledger may be running it, or
    it was deleted here: either way only a stopped heartbeat proves it dead); or the token
    names no Dagster run (its run-id part is not a UUID: an owner outside Dagster, such as a
    test's).
    """

    def ended(owner: str) -> str | None:
        run_id = owner_run_id(owner)
        if run_id is None:
            return None
        run = instance.get_run_by_id(run_id)
        if run is None or run.status not in ENDED_RUN_STATUSES:
            return None
        return str(run.status.value)

    return ended


def end_taken_over_run(
    instance: dg.DagsterInstance,
    owner: str,
    reason: str,
    *,
    current_run_id: str,
    ledger: LedgerStore | None = None,
    settings: ResumeSettings | None = None,
) -> str | None:
    """Mark the Dagster run of an owner whose lapsed lease was just taken over as failed.

    Its worker is gone (killed, its pod evicted) or fenced: it can publish nothing more.
    A run launched outside the run launcher (``storyboard materialize``) or by a launcher
    without health checks stays "started" for ever otherwise, and with a per-partition
    concurrency limit (deploy/dagster.yaml) every later run of its episode would wait
    behind it in the queue. Only a run not ended yet and not this run itself (a retry
    taking over its own earlier attempt); returns the run id marked, else None.
    """
    run_id = owner_run_id(owner)
    if run_id is None or run_id == current_run_id:
        return None
    if ledger is not None and settings is not None:
        lease = ledger.run_leases([run_id]).get(run_id)
        now = datetime.now(UTC)
        alive = lease is not None and coordinator_alive(
            lease.heartbeat_at, lease.ended_at, settings, now
        )
        if alive:  # its coordinator lives: only its step was lost (docs/DESIGN.md#run-leases)
            return None
    found = instance.get_run_by_id(run_id)
    if found is None or found.status in ENDED_RUN_STATUSES:
        return None
    instance.report_run_failed(found, f"run worker lost: {reason}")
    return run_id


def owner_token(context: dg.AssetExecutionContext) -> str:
    """Ledger owner: the Dagster run id plus the retry attempt (a retry is a new owner)."""
    return f"{context.run.run_id}:{context.retry_number}"


def _log_ended(context: dg.AssetExecutionContext, ended: str | None, reason: str) -> None:
    if ended is not None:
        context.log.warning(f"marked run {ended} failed: {reason}")


def _failure(
    error: PipelineError,
    judge: StepJudge | None,
    partition_key: str,
    *,
    allow_retries: bool,
) -> dg.Failure:
    """A typed error as the step's Dagster failure: the UI shows its one line first."""
    metadata = {**error.as_metadata(), "resume/partition": partition_key}
    try:  # name the file the failure is about (the key is valid once parsed)
        if judge is not None:
            key = judge.key(partition_key)
            metadata["checkpoint/path"] = str(judge.checkpoints.path_for(key))
    except PipelineError:
        pass
    return dg.Failure(description=str(error), metadata=metadata, allow_retries=allow_retries)


def _accepts(
    context: dg.AssetExecutionContext,
    checkpoints: CheckpointStore,
    key: StepKey,
    mode: LaunchMode,
) -> bool:
    """Whether this step of a ``resume/mode=accept`` run accepts instead of running.

    docs/DESIGN.md#hand-edits: a step whose checkpoint carries a hand edit accepts it; so does
    a step the run selected alone (the launch named it to accept: nothing to accept is then
    its typed failure, not a silent resume). Every other step of the run judges itself as
    usual, so a tagged launch of a whole partition accepts where there are edits and resumes
    elsewhere.
    """
    if mode is not LaunchMode.ACCEPT:
        return False
    # A launched run (UI, GraphQL, backfill) names its assets in ``asset_selection``; an
    # in-process materialize of a selection runs a job built of only those, with that field
    # empty: the job's own assets then say what the run selected.
    selected = context.run.asset_selection or context.job_def.asset_layer.executable_asset_keys
    alone = set(selected) == {context.asset_key}
    return alone or hand_edited(checkpoints, key)


def _accepted_metadata(step: Step, done: Accepted, path: str) -> dict[str, Any]:
    """What the materialization of an accepted hand edit says: the decision, the fields."""
    assert done.checkpoint is not None
    fields = ", ".join(done.changed)
    metadata: dict[str, Any] = {
        "resume/decision": ACCEPTED,
        "resume/reason": f"hand edit accepted: {fields}",
        "resume/origin": MANUAL,
        "resume/status": done.status or "",
        "resume/provider_calls": 0,  # an accept never calls a model
        "resume/accepted_fields": fields,
        "checkpoint/path": path,
        "checkpoint/content_hash": done.checkpoint.content_hash,
        "checkpoint/artifacts": len(done.checkpoint.artifacts),
        "step/schema_version": step.schema_version,
    }
    if done.archived:
        metadata["checkpoint/archived"] = done.archived
    return metadata


def _outcome_metadata(step: Step, outcome: StepOutcome, path: str) -> dict[str, Any]:
    decision = outcome.decision
    metadata: dict[str, Any] = {
        "resume/decision": decision.label,
        "resume/reason": decision.reason,
        "resume/origin": decision.origin.value if decision.origin else "none",
        "resume/status": outcome.status.value,  # text: Dagster metadata takes no enum
        "resume/provider_calls": outcome.provider_calls,
        "checkpoint/path": path,
        "step/schema_version": step.schema_version,
    }
    if outcome.checkpoint is not None:
        metadata["checkpoint/content_hash"] = outcome.checkpoint.content_hash
        metadata["checkpoint/artifacts"] = len(outcome.checkpoint.artifacts)
    for name, value in outcome.metadata.items():
        if isinstance(value, Markdown):  # the image steps' contact sheet, rendered
            metadata[f"step/{name}"] = dg.MetadataValue.md(value.text)
        elif isinstance(value, str | int | float | bool):
            metadata[f"step/{name}"] = value
    return metadata


def _output(checkpoint: Checkpoint, metadata: dict[str, Any]) -> dg.Output[Checkpoint]:
    """The step's output, its DataVersion the checkpoint's content hash."""
    with warnings.catch_warnings():
        # data_version on Output is beta in Dagster 1.13; we rely on it deliberately so
        # Dagster's staleness agrees with the ledger. Silenced here only.
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.Output(
            checkpoint, data_version=dg.DataVersion(checkpoint.content_hash), metadata=metadata
        )


def build_step_asset(step: Step, graph: StepGraph) -> dg.AssetsDefinition:
    """One judged asset: the run protocol wraps the step; the step never sees Dagster."""

    @dg.asset(
        name=step.step_id,
        partitions_def=episodes,
        ins={dep: dg.AssetIn(key=dep) for dep in step.deps},
        io_manager_key=IO_MANAGER_KEY,
        check_specs=[
            dg.AssetCheckSpec(RESUME_CHECK, asset=step.step_id, description=RESUME_CHECK_HELP)
        ],
        metadata={
            STEP_METADATA_KEY: step_import_path(step),
            "resume/schema_version": step.schema_version,
            "resume/config_keys": ", ".join(step.resume_config_keys) or "none",
            "resume/modifies": ", ".join(step.modifies_checkpoints) or "none",
        },
        description=step.description or None,
        group_name=GROUP,
        required_resource_keys={"pipeline", *(kind.resource_key for kind in MODEL_KINDS)},
    )
    def _judged_step(
        context: dg.AssetExecutionContext, **inputs: Checkpoint | None
    ) -> Iterator[Any]:
        pipeline = context.resources.pipeline
        tags = context.run.tags
        judge: StepJudge | None = None
        ledger: LedgerStore | None = None
        accepted: Accepted | None = None
        outcome: StepOutcome | None = None
        try:  # settings and redraw tags are read here too: invalid ones fail typed
            mode = launch_mode(tags)
            run = RunInfo(
                owner_token(context),
                # The run protocol never sees ``accept``: a step that does not accept below
                # runs exactly as an untagged one (docs/DESIGN.md#hand-edits).
                LaunchMode.RESUME if mode is LaunchMode.ACCEPT else mode,
                launch_path(tags),
                parse_redraw(tags),
            )
            # The full stores: the runner and an accept write through them; the judge gets
            # them as its readers (``steps.readers``) and cannot write through them.
            ledger, checkpoints = pipeline.ledger(), pipeline.checkpoints()
            judge = StepJudge(
                step,
                graph=graph,
                settings=pipeline.settings(),
                ledger=ledger,
                checkpoints=checkpoints,
                log=context.log,
                owner_ended=owner_ended_in(context.instance),
            )
            key = judge.key(context.partition_key)
            if _accepts(context, checkpoints, key, mode):
                accepted = accept_hand_edit(
                    judge,
                    key,
                    ledger=ledger,
                    checkpoints=checkpoints,
                    run_id=run.run_id,
                    launch_path=run.launch_path,
                )
                if not accepted.accepted:  # the run asked this step to accept: it cannot
                    raise PipelineError(
                        ErrorCode.ACCEPT_NOTHING,
                        f"{key}: launched with tag {MODE_TAG}=accept, but there is nothing to "
                        f"accept ({accepted.note}); nothing was changed",
                    )
            else:
                instance, settings = context.instance, judge.settings  # to end a lost run
                runner = StepRunner(
                    judge,
                    ledger=ledger,
                    checkpoints=checkpoints,
                    models={
                        kind.name: getattr(context.resources, kind.resource_key)
                        for kind in MODEL_KINDS
                    },
                    on_takeover=lambda owner, reason: _log_ended(
                        context,
                        end_taken_over_run(
                            instance,
                            owner,
                            reason,
                            current_run_id=context.run.run_id,
                            ledger=ledger,
                            settings=settings,
                        ),
                        reason,
                    ),
                )
                outcome = runner.run(context.partition_key, run, inputs)
        except (dg.DagsterError, dg.Failure, dg.RetryRequested):
            raise  # Dagster's own control flow
        except PipelineError as error:
            if is_stop(error):  # a BLOCK or the spend cap: Dagster's run retries leave it
                stop_run_retries(context.instance, context.run.run_id, step.step_id, error)
            raise _failure(error, judge, context.partition_key, allow_retries=False) from error
        except Exception as exc:
            # Raised bare, Dagster describes it as its own wrapper ("Error occurred while
            # executing op ...") and the cause sits in a stack trace below. Typed here, the
            # failure's first line names it: a storage fault by its code, anything else as
            # ``internal`` with its type and message. The traceback stays (raised from it),
            # and so does any retry policy, as for the bare exception.
            where = ledger.engine.url.render_as_string() if judge and ledger else None
            cause = root_cause(exc, ledger=where)
            raise _failure(cause, judge, context.partition_key, allow_retries=True) from exc
        path = str(judge.checkpoints.path_for(judge.key(context.partition_key)))
        if accepted is not None:
            # The accepted envelope is the output, as a SKIP's checkpoint is: downstream
            # steps of the run get it as input and judge themselves against it.
            assert accepted.checkpoint is not None
            context.log.info(
                f"{step.step_id} [{context.partition_key}]: {ACCEPTED} — hand edit accepted "
                f"({', '.join(accepted.changed)}), no model call"
            )
            yield _output(accepted.checkpoint, _accepted_metadata(step, accepted, path))
            yield dg.AssetCheckResult(
                check_name=RESUME_CHECK,
                passed=True,
                metadata={"resume/decision": ACCEPTED, "resume/status": accepted.status or ""},
            )
            return
        assert outcome is not None and outcome.checkpoint is not None
        metadata = _outcome_metadata(step, outcome, path)
        decision = outcome.decision
        context.log.info(
            f"{step.step_id} [{context.partition_key}]: {decision.label} — {decision.reason}"
        )
        yield _output(outcome.checkpoint, metadata)
        for victim in outcome.mutated:
            context.log_event(
                dg.AssetObservation(
                    asset_key=victim,
                    partition=context.partition_key,
                    metadata={"resume/mutated_by": step.step_id, "resume/run_id": run.run_id},
                )
            )
        yield dg.AssetCheckResult(
            check_name=RESUME_CHECK,
            passed=True,
            metadata={
                "resume/decision": outcome.decision.label,
                "resume/status": outcome.status.value,  # text: Dagster metadata takes no enum
            },
        )

    return _judged_step


def build_step_assets(steps: Sequence[Step]) -> list[dg.AssetsDefinition]:
    graph = StepGraph(steps)
    unknown = graph.unknown_deps()
    if unknown:
        raise PipelineError(ErrorCode.INPUT_INVALID, f"steps depend on undeclared steps {unknown}")
    return [build_step_asset(s, graph) for s in steps]
