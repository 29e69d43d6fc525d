"""Store-level tests' helpers: a small checkpoint envelope (one key, items as data), and
the checkpoint or ledger row a test expects to be there."""

from judge_steps import make_data

from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from resources.checkpoints.envelope import Checkpoint
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore

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


def loaded(store: CheckpointStore, key: StepKey) -> Checkpoint:
    """``key``'s published checkpoint, which the test expects to be there."""
    found = store.load(key)
    assert found is not None, f"{key} has no published checkpoint"
    return found


def stored_row(ledger: LedgerStore, key: StepKey) -> LedgerRow:
    """``key``'s ledger row, which the test expects to be there."""
    found = ledger.get(key)
    assert found is not None, f"{key} has no ledger row"
    return found
