"""One settings registry: every ``PIPELINE_*`` variable is a row of
``pipeline_defs/resume/settings_registry.py``, and no other module reads one.

Tests and benchmarks are outside the rule (they set variables for the processes they start,
and read the harness's own: ``PIPELINE_TEST_PG_URL``, ``PIPELINE_REQUIRE_*``). One product
read takes a name it is given rather than one of the table: a real provider's key, whose
variable a project names (``api_key_env``, ``PIPELINE_PROVIDER_API_KEY`` by default, the
registry's row ``provider_api_key``), read by ``resources/providers/openai_http.py``.
"""

import ast
import importlib
import re
from pathlib import Path
from typing import Any

from source_trees import parse_source

from pipeline_defs.resume.settings import ENV_NAMES, LEDGER_KEYS, ResumeSettings
from pipeline_defs.resume.settings_registry import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("pipeline_defs", "resources", "sensors")
REGISTRY = ROOT / "pipeline_defs" / "resume" / "settings_registry.py"
VARIABLE = re.compile(r"PIPELINE_[A-Z0-9_]+")


def _modules() -> list[tuple[Path, str]]:
    found = []
    for path in sorted(p for d in PRODUCT for p in (ROOT / d).rglob("*.py")):
        if path == REGISTRY or "migrations" in path.parts or path.name == "__main__.py":
            continue
        relative = path.relative_to(ROOT).with_suffix("")
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        found.append((path, ".".join(parts)))
    return found


def variable_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Each string constant that is a whole ``PIPELINE_*`` name (a declared variable)."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and VARIABLE.fullmatch(node.value)
    ]


def _keys_read(tree: ast.AST) -> list[ast.expr]:
    """The key of each ``x.get(key)``, ``os.getenv(key)``, ``x[key]`` (a read) in the tree."""
    keys: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in ("get", "getenv", "pop", "setdefault"):
                keys.append(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            keys.append(node.slice)
    return keys


def variables_read(tree: ast.AST, namespace: dict[str, Any]) -> list[tuple[int, str]]:
    """Each read whose key, evaluated in the module's namespace, is a ``PIPELINE_*`` name
    (``os.environ.get(CRASH_ENV)``, ``source[ENV_NAMES["home"]]``); keys that name a local
    cannot be evaluated and are left to the literal rule."""
    found = []
    for key in _keys_read(tree):
        if not isinstance(key, ast.Name | ast.Attribute | ast.Subscript):
            continue
        try:
            value = eval(compile(ast.Expression(key), "<key>", "eval"), dict(namespace))
        except Exception:
            continue
        if isinstance(value, str) and VARIABLE.fullmatch(value):
            found.append((key.lineno, value))
    return found


def test_no_module_but_the_registry_names_or_reads_a_pipeline_variable() -> None:
    named: list[str] = []
    read: list[str] = []
    for path, name in _modules():
        tree = parse_source(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT)
        named += [f"{where}:{line} {value}" for line, value in variable_literals(tree)]
        namespace = vars(importlib.import_module(name))
        read += [f"{where}:{line} {value}" for line, value in variables_read(tree, namespace)]
    assert named == [], "a PIPELINE_* name outside the registry (take it from its row)"
    assert read == [], "a PIPELINE_* variable read outside the registry (use its read())"


def test_the_rule_sees_a_read_and_a_name() -> None:
    tree = parse_source(
        'import os\nX = "PIPELINE_HOME"\nos.environ.get(X)\nos.environ[NAMES["h"]]\n'
    )
    namespace = {"X": "PIPELINE_HOME", "NAMES": {"h": "PIPELINE_HOME"}}
    assert variable_literals(tree) == [(2, "PIPELINE_HOME")]
    assert variables_read(tree, namespace) == [(3, "PIPELINE_HOME"), (4, "PIPELINE_HOME")]


def test_the_judges_settings_are_rows_of_the_registry() -> None:
    """Each field of ``ResumeSettings`` takes its default, bounds and doc from its row."""
    for name, field in ResumeSettings.model_fields.items():
        if name == "max_calls_source":  # where the cap came from: no variable
            continue
        row = SETTINGS[name]
        assert ENV_NAMES[name] == row.var
        assert field.description == row.doc, name
        assert field.default == row.default, name
        assert ResumeSettings.model_fields[name].annotation in (row.type, row.type | None)
    # The ledger's keys, in the order ``settings show`` and ``status`` print them.
    assert LEDGER_KEYS == (
        "running_timeout_seconds",
        "lease_seconds",
        "heartbeat_seconds",
        "max_recovery_attempts",
        "retry_backoff_seconds",
        "max_calls_per_episode",
    )


def test_every_row_reads_only_its_variable() -> None:
    assert SETTINGS.read("PIPELINE_HOME", {"PIPELINE_HOME": "/h"}) == "/h"
    assert SETTINGS.read("PIPELINE_HOME", {}) == ""
    try:
        SETTINGS.read("PIPELINE_NOT_A_SETTING", {})
    except KeyError:
        pass
    else:
        raise AssertionError("a variable outside the table was read")
