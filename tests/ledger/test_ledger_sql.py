"""The ledger's SQL is named in its statement modules (docs/DESIGN.md#ledger-sql).

Every statement the store's parts run is built in ``resources/ledger/statements.py`` or the
statement module of its concern beside it (``*_statements.py``); the parts decide when it
runs and in which transaction. A statement built anywhere else in the
ledger (a ``select``, an ``update``, a ``where``, a string of SQL) is reported here.
"""

import ast
from pathlib import Path

from source_trees import parse_source

LEDGER = Path(__file__).resolve().parents[2] / "resources" / "ledger"

# Where SQL may be written, and why.
ALLOWED = {
    "statements.py": "the named statements themselves (a step row's)",
    "claim_statements.py": "the named statements of claims",
    "pointer_statements.py": "the named statements of commit pointers and seals",
    "history_statements.py": "the named statements of history lines",
    "cost_statements.py": "the named statements of provider calls and episode counts",
    "settings_statements.py": "the named statements of the settings table",
    "run_lease_statements.py": "the named statements of run leases",
    "rate_statements.py": "the named statements of the shared rate limit",
    "spend_statements.py": "the named statements of money reserved and settled",
    "tables.py": "the tables' definitions (CHECK texts, server defaults)",
    "transitions.py": "the status condition each operation's WHERE takes, from the table",
    "engine.py": "the connection's own PRAGMAs and BEGIN (no statement of the ledger's)",
}
# Building a statement: SQLAlchemy's constructors (called by name, or on the module:
# ``sa.update``, never a dict's ``update``) ...
CONSTRUCTORS = {
    "select",
    "insert",
    "update",
    "delete",
    "union",
    "text",
    "bindparam",
    "and_",
    "or_",
    "tuple_",
}
MODULES = {"sa", "sqlalchemy", "postgresql", "sqlite"}
# ... and the clauses chained onto a statement.
CLAUSES = {
    "where",
    "with_for_update",
    "order_by",
    "returning",
    "from_select",
    "on_conflict_do_update",
    "on_conflict_do_nothing",
}
# Running a string as SQL.
RUNNERS = {"execute", "exec_driver_sql"}


def _builds(node: ast.Call) -> str | None:
    """The name of the SQLAlchemy builder ``node`` calls, if it calls one."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id if func.id in CONSTRUCTORS else None
    if not isinstance(func, ast.Attribute):
        return None
    if func.attr in CLAUSES:
        return func.attr
    on_module = isinstance(func.value, ast.Name) and func.value.id in MODULES
    return func.attr if func.attr in CONSTRUCTORS and on_module else None


def _runs_text(node: ast.Call) -> str | None:
    """``execute``/``exec_driver_sql`` if ``node`` runs a string written in place."""
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in RUNNERS or not node.args:
        return None
    return func.attr if isinstance(node.args[0], ast.Constant | ast.JoinedStr) else None


def sql_written_outside_statements(ledger: Path) -> list[str]:
    """``file:line name`` of every statement built, or SQL text run, outside the allowed
    modules of ``ledger`` (the migrations excepted: each is its schema change)."""
    found: list[str] = []
    for path in sorted(ledger.rglob("*.py")):
        relative = path.relative_to(ledger)
        if relative.parts[0] == "migrations" or relative.as_posix() in ALLOWED:
            continue
        tree = parse_source(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _builds(node) or _runs_text(node)
            if name is not None:
                found.append(f"{relative}:{node.lineno} {name}")
    return found


def test_the_ledger_names_its_sql_in_one_module() -> None:
    offenders = sql_written_outside_statements(LEDGER)
    assert not offenders, f"build these in a statement module (ALLOWED): {offenders}"


def test_the_scan_finds_sql_written_in_a_part(tmp_path: Path) -> None:
    """A part that builds its own statement, or runs a string of SQL, is found."""
    (tmp_path / "statements.py").write_text("import sqlalchemy as sa\nQ = sa.select(1)\n")
    (tmp_path / "reads.py").write_text(
        "import sqlalchemy as sa\n"
        "def one(conn, t):\n"
        "    conn.execute(sa.select(t).where(t.c.id == 1))\n"
        "    conn.exec_driver_sql('LOCK TABLE settings')\n"
        "    params = {}\n"
        "    params.update(a=1)\n"
    )
    assert sorted(sql_written_outside_statements(tmp_path)) == [
        "reads.py:3 select",
        "reads.py:3 where",
        "reads.py:4 exec_driver_sql",
    ]


def test_the_named_statements_run_nothing() -> None:
    """The statement modules only build: when and in which transaction is the parts'
    business."""
    named = [name for name in ALLOWED if name.endswith("statements.py")]
    assert len(named) > 1 and all((LEDGER / name).is_file() for name in named), named
    runs = [
        f"{name}:{node.lineno} {node.func.attr}"
        for name in named
        for node in ast.walk(parse_source((LEDGER / name).read_text(), name))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in RUNNERS | {"begin", "connect", "commit"}
    ]
    assert not runs, runs
