"""The step ledger: fenced claims, owner-aware transitions, audit and provider-call rows."""

from resources.ledger.store import LedgerStore
from resources.ledger.tables import metadata, provider_call, step_run, step_transition

__all__ = ["LedgerStore", "metadata", "provider_call", "step_run", "step_transition"]
