"""Checkpoint IO manager: integrity-checked loads, fenced idempotent saves."""

from typing import Any

import dagster as dg

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.judge import input_problem
from pipeline_defs.steps.spec import Step, load_step
from resources.checkpoints.envelope import Checkpoint
from resources.pipeline import PipelineResource

STEP_METADATA_KEY = "resume/step"


def _step_from(metadata: Any, asset_key: dg.AssetKey) -> Step:
    path = (metadata or {}).get(STEP_METADATA_KEY)
    if path is None:
        raise PipelineError(
            ErrorCode.IO_INTEGRITY_VIOLATION,
            f"asset {asset_key.to_user_string()} is not a judged step",
        )
    return load_step(str(getattr(path, "value", path)))


def _as_failure(error: PipelineError, asset_key: dg.AssetKey, partition_key: str) -> dg.Failure:
    """A typed error as a Dagster failure whose description and metadata name path and origin.

    A bare exception raised here would reach the event log as a wrapped stack trace without
    its code, origin or path; ``dg.Failure`` is passed through by Dagster unchanged.
    """
    origin = f" (origin: {error.origin})" if error.origin else ""
    metadata: dict[str, str] = {
        **error.as_metadata(),
        "resume/asset": asset_key.to_user_string(),
        "resume/partition": partition_key,
    }
    if "path" in error.details:
        metadata["checkpoint/path"] = str(error.details["path"])
    return dg.Failure(description=f"{error}{origin}", metadata=metadata, allow_retries=False)


class CheckpointIOManager(dg.ConfigurableIOManager):
    """Stores each asset partition as a checkpoint envelope (docs/DESIGN.md#checkpoints).

    The run protocol has normally published the checkpoint already (under the ledger row
    lock); saving identical content again is a no-op, so a SKIP never touches the disk.
    """

    pipeline: PipelineResource

    def _key(self, asset_key: dg.AssetKey, partition_key: str) -> StepKey:
        return Episode.parse(partition_key).step(asset_key.path[-1])

    def handle_output(self, context: dg.OutputContext, obj: Checkpoint | None) -> None:
        try:
            self._handle_output(context, obj)
        except PipelineError as error:
            raise _as_failure(error, context.asset_key, context.asset_partition_key) from error

    def load_input(self, context: dg.InputContext) -> Checkpoint | None:
        try:
            return self._load_input(context)
        except PipelineError as error:
            raise _as_failure(error, context.asset_key, context.asset_partition_key) from error

    def _handle_output(self, context: dg.OutputContext, obj: Checkpoint | None) -> None:
        if obj is None:
            return
        if not isinstance(obj, Checkpoint):
            raise PipelineError(
                ErrorCode.IO_INTEGRITY_VIOLATION,
                f"{context.asset_key.to_user_string()}: output is not a checkpoint envelope",
            )
        step = _step_from(context.definition_metadata, context.asset_key)
        checkpoints = self.pipeline.checkpoints()
        source = str(checkpoints.path_for(obj.key))
        # a not-applicable one: its data is empty by design (as in load_input)
        if obj.status != StepStatus.NOT_APPLICABLE:
            step.validate_data(obj.data, source=source)
        ledger = self.pipeline.ledger()
        run_id = obj.run_id or ""
        written = checkpoints.save(
            obj,
            fence=lambda staged: ledger.publish(
                obj.key, run_id, staged.commit, pointer=staged.pointer
            ),
        )
        context.add_output_metadata({"checkpoint/path": source, "checkpoint/rewritten": written})

    def _load_input(self, context: dg.InputContext) -> Checkpoint | None:
        upstream = context.upstream_output
        asset_key = context.asset_key
        key = self._key(asset_key, context.asset_partition_key)
        checkpoints = self.pipeline.checkpoints()
        checkpoint = checkpoints.load(key)
        if checkpoint is None:
            return None  # the step's gate reports it with a clear reason
        step = _step_from(upstream.definition_metadata if upstream else None, asset_key)
        problem = input_problem(step, checkpoints, checkpoint)  # the judge's word on it
        if problem is not None:
            raise problem
        return checkpoint
