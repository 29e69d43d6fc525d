"""The layer order of docs/ARCHITECTURE.md, enforced by import-linter.

``lint-imports`` reads the contracts in pyproject.toml (``[tool.importlinter]``). These tests
prove both directions: the product passes, and a deliberately wrong-way import — the ledger
adapter importing the run protocol — fails CI with the contract named.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("pipeline_defs", "resources", "sensors")


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` on the packages under ``tree`` (first on the import path)."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=tree,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree), "HOME": str(tree)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def copy_product(dest: Path) -> Path:
    for package in PRODUCT:
        shutil.copytree(
            ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_product_keeps_its_layers() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "0 broken" in result.stdout


def test_a_wrong_way_import_fails(tmp_path: Path) -> None:
    tree = copy_product(tmp_path)
    store = tree / "resources" / "ledger" / "store.py"
    store.write_text(store.read_text() + "\nimport pipeline_defs.steps.runner  # wrong way\n")
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout[-4000:]
    assert "BROKEN" in result.stdout
    assert "resources.ledger.store -> pipeline_defs.steps.runner" in result.stdout


def test_the_pure_core_imports_no_framework(tmp_path: Path) -> None:
    tree = copy_product(tmp_path)
    decision = tree / "pipeline_defs" / "resume" / "decision.py"
    decision.write_text(decision.read_text() + "\nimport dagster  # wrong: the judge is pure\n")
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout[-4000:]
    assert "pipeline_defs.resume.decision -> dagster" in result.stdout


def test_the_batch_judgement_and_the_run_protocol_import_no_dagster(tmp_path: Path) -> None:
    tree = copy_product(tmp_path)
    for planted in ("judging/tick.py", "steps/judge.py"):
        module = tree / "pipeline_defs" / planted
        module.write_text(module.read_text() + "\nimport dagster  # wrong: Dagster-free\n")
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout[-4000:]
    assert "pipeline_defs.judging.tick -> dagster" in result.stdout
    assert "pipeline_defs.steps.judge -> dagster" in result.stdout
