"""Checkpoints: the envelope, the file store and the Dagster IO manager over them."""

from resources.checkpoints.envelope import Artifact, Checkpoint, mask_secrets
from resources.checkpoints.store import CheckpointStore

__all__ = ["Artifact", "Checkpoint", "CheckpointStore", "mask_secrets"]
