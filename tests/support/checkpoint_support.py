"""A small checkpoint envelope for store-level tests (one key, items as data)."""

from judge_steps import make_data

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import StepStatus
from resources.checkpoints.envelope import Checkpoint

KEY = StepKey("proj1", "ep1", "alpha")


def checkpoint(*items: str, run_id: str = "run-1:0") -> Checkpoint:
    return Checkpoint(
        step_id=KEY.step_id,
        project_id=KEY.project_id,
        episode_id=KEY.episode_id,
        status=StepStatus.COMPLETED,
        schema_version=1,
        config_hash="c",
        resume_config_keys=(),
        config_fingerprints={},
        project_config_snapshot={},
        data=make_data(list(items)),
        produced_by={"run_id": run_id},
        created_at=f"created by {run_id}",
    )
