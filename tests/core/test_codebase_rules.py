"""Rules of the code base that review alone would let slip."""

import ast
import enum
import importlib
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from source_trees import parse_source

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["pipeline_defs", "resources", "sensors"]


def product_files() -> list[Path]:
    return sorted(p for d in PRODUCT for p in (ROOT / d).rglob("*.py"))


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"^\s*(from|import)\s+dagster\._", "no private dagster imports"),
        (r"::\s*timestamptz", "timestamps are never cast in SQL"),
        (r"advisory", "claims use no advisory locks"),
        (r"filterwarnings\(\s*[\"']ignore[\"']\s*\)", "no global warning suppression"),
    ],
)
def test_forbidden_patterns(pattern: str, why: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in product_files()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(pattern, line)
    ]
    assert not offenders, f"{why}: {offenders}"


def test_sql_lives_only_in_the_ledger_store() -> None:
    """Raw SQL and SQLAlchemy statements belong to resources/ledger (migrations included)."""
    pattern = re.compile(
        r"\b(exec_driver_sql|sa\.text|sqlalchemy\.text|sa\.(select|update|insert|delete))\("
    )
    offenders = [
        str(path.relative_to(ROOT))
        for path in product_files()
        if "resources/ledger" not in path.as_posix() and pattern.search(path.read_text())
    ]
    assert not offenders, offenders


def test_the_code_location_loads_without_environment(tmp_path: Path) -> None:
    """Importing the code location reads no environment and touches no database."""
    env = {"PATH": "/usr/bin:/bin", "DAGSTER_HOME": str(tmp_path)}
    script = (
        "import pipeline_defs, sys; d = pipeline_defs.defs; "
        "print(len(list(d.assets or [])), 'sqlalchemy.engine' in sys.modules and "
        "any(k.startswith('psycopg') for k in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert not list(tmp_path.iterdir()), "importing the code location wrote files"


def test_dagster_validates_the_workspace(tmp_path: Path) -> None:
    dagster = Path(sys.executable).with_name("dagster")
    result = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DAGSTER_HOME": str(tmp_path), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "Validation successful for code location storyboard" in result.stdout + result.stderr


def test_dagster_finds_the_definitions_with_the_module_loader(tmp_path: Path) -> None:
    """``dagster dev -m pipeline_defs``: the module loader lists the package's
    members, so the lazily imported ``defs`` must be among them."""
    dagster = Path(sys.executable).with_name("dagster")
    result = subprocess.run(
        [str(dagster), "definitions", "validate", "-m", "pipeline_defs"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "DAGSTER_HOME": str(tmp_path), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "Validation successful for code location pipeline_defs" in result.stdout + result.stderr


CITED = re.compile(r"docs/DESIGN\.md#([a-z0-9-]+)")
STALE_CITATION = re.compile(r"SPEC §|SPEC\.md|shared/SPEC|\b[Ii]ssues? \d+")


def _repo_texts() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "*.py", "*.md", "*.toml", "*.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_the_repo_explains_itself() -> None:
    """Code and docs cite the design in the repo (docs/DESIGN.md, by anchors that exist),
    never a spec a clone does not have, nor issue numbers (history belongs in git)."""
    anchors = set(re.findall(r'<a id="([a-z0-9-]+)"', (ROOT / "docs" / "DESIGN.md").read_text()))
    stale: list[str] = []
    dangling: list[str] = []
    for path in _repo_texts():
        if path == Path(__file__):
            continue  # the patterns above
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{n}"
            if STALE_CITATION.search(line):
                stale.append(where)
            dangling += [f"{where} #{a}" for a in CITED.findall(line) if a not in anchors]
    assert not stale, f"cite docs/DESIGN.md instead: {stale}"
    assert not dangling, f"no such anchor in docs/DESIGN.md: {dangling}"


# The names of the data layout (pipeline_defs.resume.layout): spelled there and only there.
LAYOUT_MODULE = "pipeline_defs/resume/layout.py"
LAYOUT_NAMES = {
    "checkpoint.json": "CHECKPOINT_FILE",
    "archive": "ARCHIVE_DIR",
    "pending": "PENDING_DIR",
    ".force_cleared": "FORCE_MARKER",
    ".staging": "STAGING_DIR",
    ".published": "PUBLISHED_MARKER",
    ".scratch": "SCRATCH_DIR",
    "story.md": "STORY_FILE",
    "project.yaml": "PROJECT_FILE",
    "ledger.sqlite3": "LEDGER_FILE",
    "checkpoints": "CHECKPOINTS",
    "projects": "PROJECTS",
    "episodes": "EPISODES",
}
# Names that are also plain words (a status "pending"): flagged only where a path is built.
_PATH_TARGET = re.compile(r"(_DIR|_FILE|_ROOT|_NAME|_MARKER)$")
_PATH_CALLS = {"Path", "PurePath", "join", "joinpath", "with_name", "glob", "rglob"}


def _names_in(text: str) -> set[str]:
    return {part for part in text.split("/") if part in LAYOUT_NAMES}


def _spells_layout(node: ast.AST) -> str | None:
    """The layout name ``node`` spells as a path part (a literal or a layout constant)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        found = _names_in(node.value)
        return min(found) if found else None
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name if name in LAYOUT_NAMES.values() else None


def _layout_offenders(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        spelled: list[str | None] = []
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            spelled = [_spells_layout(node.left), _spells_layout(node.right)]
        elif isinstance(node, ast.JoinedStr) and any(
            isinstance(v, ast.Constant) and "/" in str(v.value) for v in node.values
        ):
            spelled = [
                _spells_layout(v.value if isinstance(v, ast.FormattedValue) else v)
                for v in node.values
            ]
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called in _PATH_CALLS:
                spelled = [_spells_layout(arg) for arg in node.args]
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            if getattr(node.comparators[0], "attr", None) == "parts":
                spelled = [_spells_layout(node.left)]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            targets = [getattr(t, "id", "") for t in node.targets]
            if value in LAYOUT_NAMES and (
                "." in value or any(_PATH_TARGET.search(t) for t in targets)
            ):
                spelled = [value]
        found += [(getattr(node, "lineno", 0), name) for name in spelled if name]
    return found


def test_paths_of_the_data_layout_are_built_by_the_layout() -> None:
    """``DataLayout`` owns every path down into the step directory: product code outside
    the layout module joins none of its file or directory names by hand (neither the
    literal nor the layout's constant), it asks the layout."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in product_files()
        if path.relative_to(ROOT).as_posix() != LAYOUT_MODULE
        for line, name in _layout_offenders(parse_source(path.read_text()))
    ]
    assert not offenders, f"{len(offenders)} hand-built layout path(s): {offenders}"


def _only_imports(tree: ast.Module) -> bool:
    body = [
        n
        for n in tree.body
        if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))  # docstring
        and not (
            isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
        )
    ]
    return bool(body) and all(isinstance(n, ast.Import | ast.ImportFrom) for n in body)


def test_no_module_only_re_exports_names() -> None:
    """A name is imported from the module that defines it: a module that only re-exports
    names is a second door to the same room (package ``__init__`` files aside)."""
    offenders = [
        str(path.relative_to(ROOT))
        for path in product_files()
        if path.name != "__init__.py" and _only_imports(parse_source(path.read_text()))
    ]
    assert offenders == []


def _fixtures_defined(path: Path) -> set[str]:
    """Names of the pytest fixtures a module defines."""
    names = set()
    for node in ast.walk(parse_source(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if isinstance(target, ast.Attribute) and target.attr == "fixture":
                    names.add(node.name)
    return names


def test_fixtures_are_shared_not_copied() -> None:
    """A fixture wanted by three test modules lives in a conftest (tests/conftest.py); a
    module's own fixture that means something else has a name of its own."""
    where: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for name in _fixtures_defined(path):
            where.setdefault(name, []).append(str(path.relative_to(ROOT)))
    copied = {name: files for name, files in where.items() if len(files) >= 3}
    assert not copied, f"defined in three or more test modules: {copied}"


def _exempt(cls: type) -> bool:
    """Bases that say what a class is rather than lend it behaviour."""
    return (
        issubclass(cls, (BaseException, enum.Enum))
        or bool(getattr(cls, "_is_protocol", False))
        or cls is typing.Generic
    )


def test_product_classes_compose_rather_than_inherit() -> None:
    """No product class has more than two product classes above it (Protocol, Generic,
    enums and exceptions aside): stores and steps are composed of small parts they hold
    (docs/DESIGN.md#composition), not assembled from a chain of mixins."""
    offenders: dict[str, list[str]] = {}
    for path in product_files():
        if path.name == "__main__.py" or "migrations" in path.parts:
            continue  # scripts: the CLI's entry, Alembic's migrations (run, not imported)
        relative = path.relative_to(ROOT).with_suffix("")
        name = ".".join(relative.parts[:-1] if relative.name == "__init__" else relative.parts)
        module = importlib.import_module(name)
        for cls in vars(module).values():
            if not isinstance(cls, type) or cls.__module__ != name or _exempt(cls):
                continue
            above = [
                f"{base.__module__}.{base.__qualname__}"
                for base in cls.__mro__[1:]
                if base.__module__.split(".")[0] in PRODUCT
                and not _exempt(base)
                and "[" not in base.__qualname__  # Dagster's own parametrized resource class
            ]
            if len(above) > 2:
                offenders[f"{name}.{cls.__qualname__}"] = above
    assert offenders == {}


# Each adapter's own store and contract: one name for one role, in every adapter.
SHARED_MODULE_NAMES = {"__init__", "__main__", "store", "base"}


def test_no_module_name_means_two_things() -> None:
    """A module's name says what it is wherever it is imported from: two product modules in
    two packages never share one (the adapters' ``store`` and ``base`` aside: the same role
    in each adapter)."""
    where: dict[str, list[str]] = {}
    for path in product_files():
        if "migrations" not in path.parts and path.stem not in SHARED_MODULE_NAMES:
            where.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
