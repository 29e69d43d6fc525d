"""The ledger store's operations are its own methods, visible to tools.

``LedgerStore`` is composed of one session and a part per concern; each operation of a
part is a method of the store with the part's signature, delegating to it. ``help()``,
``inspect.signature``, mypy and an editor's go-to-definition then see the whole API: no
operation is a bound method of a part assigned in ``__init__``.
"""

import inspect

import pytest

from resources.ledger.audit_and_cost import AuditAndCost
from resources.ledger.claims import Claims
from resources.ledger.publishing import Publishing
from resources.ledger.reads import Reads
from resources.ledger.run_leases import RunLeases
from resources.ledger.session import LedgerSession
from resources.ledger.settings_cache import SettingsCache
from resources.ledger.status_writes import StatusWrites
from resources.ledger.store import LedgerStore

pytestmark = pytest.mark.unit

PARTS: tuple[type, ...] = (
    SettingsCache,
    Reads,
    Claims,
    StatusWrites,
    Publishing,
    AuditAndCost,
    RunLeases,
)
# The session's own operations the store names (the rest is its parts' plumbing).
SESSION_OPERATIONS = ("migrate", "ensure_schema")


def _operations() -> list[tuple[type, str]]:
    found = [
        (part, name)
        for part in PARTS
        for name, value in vars(part).items()
        if inspect.isfunction(value) and not name.startswith("_")
    ]
    return found + [(LedgerSession, name) for name in SESSION_OPERATIONS]


def _shape(signature: inspect.Signature) -> list[tuple[str, object, object, str]]:
    """Each parameter's name, kind, default and annotation (as text: a TypeVar is its own
    object in each module), the receiver left out."""
    return [
        (p.name, p.kind, p.default, str(p.annotation))
        for p in signature.parameters.values()
        if p.name != "self"
    ]


OPERATIONS = _operations()


def test_every_part_operation_is_found() -> None:
    names = {name for _, name in OPERATIONS}
    assert len(names) == len(OPERATIONS), "two parts name one operation"
    assert {"claim", "transition", "publish", "with_settled_row", "run_leases"} <= names


@pytest.mark.parametrize(
    ("part", "name"), OPERATIONS, ids=[f"{p.__name__}.{n}" for p, n in OPERATIONS]
)
def test_each_operation_is_a_method_with_the_parts_signature(part: type, name: str) -> None:
    method = vars(LedgerStore).get(name)
    assert inspect.isfunction(method), f"LedgerStore.{name} is not a method of the class"
    assert method.__doc__, f"LedgerStore.{name} has no docstring"
    mine = inspect.signature(getattr(LedgerStore, name))
    theirs = inspect.signature(getattr(part, name))
    assert _shape(mine) == _shape(theirs), name
    assert str(mine.return_annotation) == str(theirs.return_annotation), name


def test_no_operation_is_assigned_in_init() -> None:
    store = LedgerStore("sqlite://")  # builds its parts only: no connection is opened
    assigned = sorted(name for name, value in vars(store).items() if callable(value))
    assert assigned == []
    public = {n for n, v in vars(LedgerStore).items() if inspect.isfunction(v) and n[0] != "_"}
    assert public == {name for _, name in OPERATIONS}
