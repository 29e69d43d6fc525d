"""Every error code the product raises is a member of a code family.

A static scan of the product code: each ``PipelineError(...)`` / ``provider_error(...)`` /
``review_error(...)`` / ``sentinel_error(...)`` call's code (a literal, a module constant, or
a local variable assigned from either) must be a member of ``ErrorCode`` (the protocol's
own) or of a family a step declares beside itself (``StorySourceCode``...), so the families
are the whole list and ``status_of`` covers every code. A raiser that passes its own
``status=`` must agree with the member's.
"""

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from source_trees import parse_source

from pipeline_defs.resume.decision_types import BLOCK_CODES
from pipeline_defs.resume.errors import Code, ErrorCode, PipelineError, known_codes, status_of
from pipeline_defs.resume.status import LedgerRow, StepStatus, parse_status
from pipeline_defs.storyboard import STORYBOARD_STEPS
from pipeline_defs.storyboard.cards import SceneDetailCode
from pipeline_defs.storyboard.story_source import StorySourceCode
from pipeline_defs.storyboard.t2i_review import T2IReviewCode

STEP_FAMILIES = (StorySourceCode, SceneDetailCode, T2IReviewCode)

ROOT = Path(__file__).resolve().parents[2]
# Every family of codes, by class name (the storyboard's steps declare theirs: importing
# the steps, as any process that runs them does, makes them known).
FAMILIES: dict[str, type[Code]] = {f.__name__: f for f in (ErrorCode, *STEP_FAMILIES)}
# The product's codes (a test module may declare a family of its own: not counted here).
STATUS_BY_CODE = {member.value: member.status for f in FAMILIES.values() for member in f}
PRODUCT = ("pipeline_defs", "resources", "sensors")
# Helper -> (prefix it puts before its code argument, index of that argument or None for
# keyword-only, the code it uses when none is given).
WRAPPERS: dict[str, tuple[str, int | None, str | None]] = {
    "PipelineError": ("", 0, None),
    "provider_error": ("", 0, None),
    "review_error": ("", 0, None),
    "sentinel_error": ("", None, "scene_detail.sentinel_malformed"),
}
# Attributes that hold the code of an error raised (and scanned) elsewhere, or a decision's
# block code (checked against BLOCK_CODES below).
PASSED_ON = {"code", "error_code"}
CODE_TEXT = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$|^internal$")
# review_error("unknown_item_id") and the like: the helper adds the dotted prefix.
SUFFIX_TEXT = re.compile(r"^[a-z0-9_]+$")
# Members nothing raises today, kept because their code is published (docs): none now.
UNRAISED: set[str] = set()


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class _Module:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = parse_source(path.read_text(encoding="utf-8"))
        self.constants: dict[str, ast.expr] = {}
        self.imports: dict[str, tuple[str, str]] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.constants[target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:  # relative: from the package this module is in
                    package = _module_of(path).split(".")
                    if path.name != "__init__.py":
                        package = package[:-1]
                    base = package[: len(package) - node.level + 1]
                    source = ".".join([*base, source] if source else base)
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (source, alias.name)


MODULES = {
    _module_of(p): _Module(p)
    for d in PRODUCT
    for p in sorted((ROOT / d).rglob("*.py"))
    if "migrations" not in p.parts
}


def _codes_in(
    expr: ast.AST,
    module: _Module,
    scope: ast.AST | None,
    depth: int = 0,
    pattern: re.Pattern[str] = CODE_TEXT,
) -> set[str]:
    """The code texts ``expr`` can evaluate to; raises on a name it cannot follow."""
    if depth > 5:
        raise AssertionError(f"{module.path}: cannot resolve {ast.unparse(expr)}")
    if isinstance(expr, ast.Constant):
        text = expr.value
        return {text} if isinstance(text, str) and pattern.match(text) else set()
    if isinstance(expr, ast.Attribute):
        if isinstance(expr.value, ast.Name) and expr.value.id in FAMILIES:
            return {FAMILIES[expr.value.id][expr.attr].value}
        if expr.attr in PASSED_ON or depth > 0:  # a passed-on code; a dict key (errno.X)
            return set()
        raise AssertionError(f"{module.path}: unknown code source {ast.unparse(expr)}")
    if isinstance(expr, ast.Name):
        return _name_codes(expr.id, module, scope, depth)
    if isinstance(expr, ast.IfExp):  # either branch, not the condition
        return _codes_in(expr.body, module, scope, depth, pattern) | _codes_in(
            expr.orelse, module, scope, depth, pattern
        )
    if isinstance(expr, ast.Subscript):  # TABLE[key]: whatever the table holds
        return _codes_in(expr.value, module, scope, depth, pattern)
    if isinstance(expr, ast.Call):  # TABLE.items() and the like
        return _codes_in(expr.func, module, scope, depth + 1, pattern)
    found: set[str] = set()
    for child in ast.iter_child_nodes(expr):
        if isinstance(child, ast.expr):
            found |= _codes_in(child, module, scope, depth, pattern)
    return found


def _name_codes(name: str, module: _Module, scope: ast.AST | None, depth: int) -> set[str]:
    if scope is not None:  # a local: follow what the function assigns or loops over
        sources: list[ast.expr] = []
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and any(
                isinstance(n, ast.Name) and n.id == name for t in node.targets for n in ast.walk(t)
            ):
                sources.append(node.value)
            elif isinstance(node, ast.For) and any(
                isinstance(n, ast.Name) and n.id == name for n in ast.walk(node.target)
            ):
                sources.append(node.iter)
        if sources:
            return set().union(*(_codes_in(s, module, None, depth + 1) for s in sources))
        if isinstance(scope, ast.FunctionDef) and scope.name in WRAPPERS:
            return set()  # the wrapper's own parameter: its callers are scanned
    if name in module.constants:
        return _codes_in(module.constants[name], module, None, depth + 1)
    if name in module.imports:
        source, original = module.imports[name]
        if source in MODULES:
            return _name_codes(original, MODULES[source], None, depth + 1)
    raise AssertionError(f"{module.path}: cannot resolve the code name {name!r}")


def _raised_codes() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}

    def visit(node: ast.AST, module: _Module, scope: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else scope
            if isinstance(child, ast.Call):
                _call(child, module, scope)
            visit(child, module, inner)

    def _call(call: ast.Call, module: _Module, scope: ast.AST | None) -> None:
        func = call.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name not in WRAPPERS:
            return
        prefix, index, default = WRAPPERS[name]
        expr = call.args[index] if index is not None and len(call.args) > index else None
        for keyword in call.keywords:
            if keyword.arg == "code":
                expr = keyword.value
        where = f"{module.path.relative_to(ROOT)}:{call.lineno}"
        if expr is None:
            assert default is not None, f"{where}: {name} without a code"
            codes = {default}
        elif isinstance(expr, ast.JoinedStr):  # the wrapper's own f"t2i_review.{code}"
            return
        else:
            pattern = SUFFIX_TEXT if prefix else CODE_TEXT
            codes = {prefix + c for c in _codes_in(expr, module, scope, pattern=pattern)}
        given = [k.value for k in call.keywords if k.arg == "status"]
        for code in codes:
            out.setdefault(code, []).append(where)
            if given and isinstance(given[0], ast.Constant) and code in STATUS_BY_CODE:
                assert given[0].value == status_of(code), f"{where}: status differs for {code}"

    for module in MODULES.values():
        visit(module.tree, module, None)
    return out


def test_every_code_raised_in_product_code_is_an_error_code() -> None:
    raised = _raised_codes()
    assert len(raised) >= 40, sorted(raised)  # the scan does see the codes
    strays = {code: where for code, where in raised.items() if code not in STATUS_BY_CODE}
    assert strays == {}
    assert set(STATUS_BY_CODE) >= BLOCK_CODES
    # And the enum lists no code nobody raises (a stale member would hide a typo).
    assert set(STATUS_BY_CODE) - set(raised) - BLOCK_CODES == UNRAISED


def test_the_scan_is_not_blind(tmp_path: Path) -> None:
    """A made-up code in a raise is found (so an empty stray list means something)."""
    module = _Module.__new__(_Module)
    module.path = ROOT / "planted.py"
    module.tree = parse_source('def f():\n    raise PipelineError("made.up", "x")\n')
    module.constants, module.imports = {}, {}
    call = next(n for n in ast.walk(module.tree) if isinstance(n, ast.Call))
    assert _codes_in(call.args[0], module, None) == {"made.up"}
    assert "made.up" not in STATUS_BY_CODE


def _codes_given_as_text(modules: Iterable[_Module]) -> list[str]:
    """Raise sites whose code is a string literal or an f-string instead of a member."""
    found: list[str] = []
    for module in modules:
        for call in ast.walk(module.tree):
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in WRAPPERS:
                continue
            index = WRAPPERS[name][1]
            given = [call.args[index]] if index is not None and len(call.args) > index else []
            given += [k.value for k in call.keywords if k.arg == "code"]
            for expr in given:
                if isinstance(expr, ast.JoinedStr) or (
                    isinstance(expr, ast.Constant) and isinstance(expr.value, str)
                ):
                    found.append(f"{module.path.name}:{call.lineno} {ast.unparse(expr)}")
    return found


def test_every_raise_site_names_its_code_by_member() -> None:
    """``PipelineError(ErrorCode.X, ...)``, never ``PipelineError("x.y", ...)``: a typo in
    text is a new code nobody handles; a typo in a member name fails at import."""
    assert _codes_given_as_text(MODULES.values()) == []


def test_the_text_scan_is_not_blind() -> None:
    module = _Module.__new__(_Module)
    module.path = ROOT / "planted.py"
    module.tree = parse_source(
        'def f(x):\n    raise PipelineError("made.up", "x")\n'
        'def g(x):\n    raise review_error(f"t2i_review.{x}", "x")\n'
        "def h(x):\n    raise PipelineError(ErrorCode.INTERNAL, x)\n"
    )
    assert _codes_given_as_text([module]) == [
        "planted.py:2 'made.up'",
        "planted.py:4 f't2i_review.{x}'",
    ]


def test_the_protocol_lists_no_step_s_own_codes() -> None:
    """The reference pipeline's codes live beside its steps: the core's family names none,
    and every family a step declares is known (and seen by the scan above)."""
    step_ids = {step.step_id for step in STORYBOARD_STEPS}
    assert not [c for c in ErrorCode if c.value.split(".")[0] in step_ids]
    declared = {
        f
        for f in Code.__subclasses__()
        if f is not ErrorCode and f.__module__.startswith("pipeline_defs.")
    }
    assert declared == set(STEP_FAMILIES)
    assert STATUS_BY_CODE.items() <= known_codes().items()
    assert status_of("t2i_review.unknown_item_id") == T2IReviewCode.UNKNOWN_ITEM_ID.status == 422


def test_status_map_covers_every_member_and_strings_still_work() -> None:
    members = [c for family in FAMILIES.values() for c in family]
    assert set(STATUS_BY_CODE) == {c.value for c in members}
    assert len(STATUS_BY_CODE) == len(members)  # no code in two families, no alias
    for code in members:
        assert PipelineError(code, "m").status == code.status == STATUS_BY_CODE[code.value]
        as_text = PipelineError(code.value, "m")
        assert as_text.code == code.value and type(as_text.code) is str
        assert as_text.status == code.status
    assert PipelineError("some.own_code", "m").status == 400  # a user's step's own code
    assert PipelineError(ErrorCode.STORAGE_FULL, "m").as_metadata()["error/code"] == "storage.full"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("completed", StepStatus.COMPLETED),
        (" RUNNING ", StepStatus.RUNNING),
        (StepStatus.STALE, StepStatus.STALE),
        (None, "unknown"),
        ("weird", "weird"),
    ],
)
def test_parse_status(raw: object, expected: str) -> None:
    parsed = parse_status(raw)
    assert parsed == expected
    assert isinstance(parsed, StepStatus) == isinstance(expected, StepStatus)


def test_ledger_row_is_typed_and_frozen() -> None:
    row = LedgerRow.from_row({"status": "running", "recovery_count": None, "extra": 1})
    assert row.status == "running" and row.run_id is None and not hasattr(row, "extra")
    assert row.status is StepStatus.RUNNING and row.is_running and row.recovery_count == 0
    with pytest.raises(AttributeError):
        row.status = StepStatus.FAILED  # type: ignore[misc]
    # Built by hand, the same types as the store's: a status text becomes the member.
    assert LedgerRow(status=" Running ", recovery_count=None) == row  # type: ignore[arg-type]


def test_ledger_row_is_not_a_mapping() -> None:
    """A column is an attribute: ``row["status"]`` or ``row.get(...)`` fail at once."""
    row = LedgerRow.from_row({"status": "completed", "run_id": "r:0"})
    assert not isinstance(row, Mapping)
    with pytest.raises(TypeError):
        row["status"]  # type: ignore[index]
    assert not hasattr(row, "get") and not hasattr(row, "keys")
    with pytest.raises(TypeError):
        dict(row)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    "columns",
    [
        ("project_id", "episode_id", "step_id", "status", "recovery_count", "checkpoint_seal"),
        ("project_id", "episode_id", "step_id"),  # no status: "unknown", as from_row says
        ("status", "extra"),  # a column LedgerRow does not know: from_row's way
    ],
)
def test_the_bulk_row_builder_builds_what_from_row_builds(columns: tuple[str, ...]) -> None:
    samples = {
        "project_id": "p",
        "episode_id": "e1",
        "step_id": "src",
        "status": " Completed ",
        "recovery_count": "3",
        "checkpoint_seal": "2\x1f…",
        "extra": 1,
    }
    values = tuple(samples[c] for c in columns)
    built = LedgerRow.builder(columns)(values)
    assert built == LedgerRow.from_row(dict(zip(columns, values, strict=True)))
    assert type(built) is LedgerRow


def test_a_step_key_built_for_a_bulk_read_is_the_same_key_and_validated() -> None:
    from pipeline_defs.resume.partition import StepKey

    fast = StepKey.of("p", "e1", "src")
    assert fast == StepKey("p", "e1", "src") and hash(fast) == hash(StepKey("p", "e1", "src"))
    assert {fast: 1}[StepKey("p", "e1", "src")] == 1
    with pytest.raises(PipelineError) as bad:
        StepKey.of("p", "../e1", "src")
    assert bad.value.code == ErrorCode.INPUT_INVALID_ID
