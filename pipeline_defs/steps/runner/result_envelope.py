"""The checkpoint envelope a run publishes: a step's result with its status, scoped config
fingerprints, masked config snapshot and provenance (who produced it, when)."""

from collections.abc import Callable
from datetime import datetime

from pipeline_defs.project import ProjectConfig, scoped_fingerprints
from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.decision_types import config_hash
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from pipeline_defs.steps.runner.run_info import RunInfo
from pipeline_defs.steps.spec import Step, StepResult
from resources.checkpoints.envelope import Checkpoint, mask_secrets


def envelope(
    step: Step,
    key: StepKey,
    result: StepResult,
    status: StepStatus,
    run: RunInfo,
    project: ProjectConfig,
    clock: Callable[[], datetime],
    started: datetime | None = None,
) -> Checkpoint:
    config = project.as_dict()
    fingerprints = scoped_fingerprints(config, step.resume_config_keys)
    return Checkpoint(
        step_id=key.step_id,
        project_id=key.project_id,
        episode_id=key.episode_id,
        status=status,
        schema_version=step.schema_version,
        config_hash=config_hash(fingerprints),
        resume_config_keys=tuple(step.resume_config_keys),
        config_fingerprints=fingerprints,
        project_config_snapshot=mask_secrets(config),
        data=dict(result.data),
        artifacts=tuple(result.artifacts),
        produced_by={
            "run_id": run.run_id,
            "started_at": format_timestamp(started or clock()),
            "launch_path": run.launch_path,
        },
        created_at=format_timestamp(clock()),
    )
