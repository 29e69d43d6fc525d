"""No test skips silently in CI.

A test that cannot run here (no root, no mount, no PostgreSQL, no browser) may skip on a
laptop; in CI the same skip would read as a pass, so there it must fail. Every
``pytest.skip`` call in the tests sits next to the ``pytest.fail`` of its CI branch, or goes
through ``must_run.skip_or_fail``.
"""

import ast
from pathlib import Path

import pytest
from must_run import in_ci, skip_or_fail
from source_trees import parse_source

TESTS = Path(__file__).resolve().parents[1]


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def test_every_skip_has_a_ci_failure_beside_it() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = parse_source(path.read_text(encoding="utf-8"), filename=str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            calls = {_dotted(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
            if "pytest.skip" in calls and "pytest.fail" not in calls:
                offenders.append(f"{path.relative_to(TESTS)}:{fn.lineno} {fn.name}")
    assert offenders == [], (
        "these skip without failing in CI; use must_run.skip_or_fail (or fail under the "
        f"variable that requires what is missing): {offenders}"
    )


@pytest.mark.parametrize(
    ("env", "fails"),
    [
        ({}, False),
        ({"CI": "false"}, False),
        ({"CI": "0"}, False),
        ({"CI": "true"}, True),
        ({"CI": "1"}, True),
        ({"PIPELINE_REQUIRE_ROOT": "1"}, True),
    ],
)
def test_skip_or_fail_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], fails: bool
) -> None:
    for name in ("CI", "PIPELINE_REQUIRE_ROOT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert in_ci() is fails
    expected = pytest.fail.Exception if fails else pytest.skip.Exception
    with pytest.raises(expected, match="needs root"):
        skip_or_fail("needs root")
