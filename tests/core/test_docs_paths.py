"""The docs name only paths that exist: a renamed or deleted module fails here, not in a
newcomer's hands. Checked: every path in backticks in README.md, BENCHMARKS.md,
deploy/README.md and docs/*.md that starts at a top folder of the repo (or a package below
``pipeline_defs/``, ``resources/`` or ``tests/``), with ``{a,b}`` alternatives expanded and a
test's ``::name`` dropped, and a bare ``name.py`` listed after a folder or a file of it."""

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    ROOT / "BENCHMARKS.md",
    ROOT / "deploy" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
TOP = ("pipeline_defs/", "resources/", "sensors/", "tests/", "benchmarks/", "deploy/", "docs/")
PACKAGES = [
    ROOT / "pipeline_defs",
    ROOT / "resources",
    ROOT / "tests",
    ROOT / "pipeline_defs/steps",
]
CODE = re.compile(r"`([^`\s]+)`")
PATH = re.compile(r"^[\w.{},/-]+\.(py|md|yaml|yml|toml|sql|sh)$|^[\w.-]+(/[\w.-]+)*/$")


def _expand(token: str) -> list[str]:
    found = re.search(r"\{([^{}]+)\}", token)
    if found is None:
        return [token]
    alternatives = found.group(1).split(",")
    return list(
        itertools.chain.from_iterable(
            _expand(token[: found.start()] + alt + token[found.end() :]) for alt in alternatives
        )
    )


def _candidates(path: str) -> list[Path]:
    if path.startswith(TOP):
        return [ROOT / path]
    return [package / path for package in PACKAGES]


def _missing_in(doc: Path) -> list[str]:
    missing: list[str] = []
    for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        where = f"{doc.relative_to(ROOT)}:{n}"
        bases: list[Path] = []  # the folders the line names (a folder, or a file's folder)
        bare: list[str] = []  # names listed without a folder, read in one of those
        for token in CODE.findall(line):
            token = token.split("::")[0].rstrip(",.:;")
            if not PATH.match(token):
                continue
            for path in _expand(token):
                if "/" not in path:
                    bare += [path] if path.endswith(".py") else []
                    continue
                found = [c for c in _candidates(path) if c.exists()]
                if not found and path.startswith(TOP):
                    missing.append(f"{where} {path}")
                bases += [c if c.is_dir() else c.parent for c in found]
        if bases:
            missing += [
                f"{where} {name} (in none of {sorted({str(b.relative_to(ROOT)) for b in bases})})"
                for name in bare
                if not any((base / name).exists() for base in bases)
            ]
    return missing


def test_the_docs_name_only_paths_that_exist() -> None:
    missing = [where for doc in DOCS for where in _missing_in(doc)]
    assert missing == [], "\n".join(missing)
