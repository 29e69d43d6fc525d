"""The benchmark scripts keep working: each starts, and its ``--help`` describes every
option. Before, ``benchmarks/resume_cost.py`` failed at import (a helper it named had
moved) and ``benchmarks/fleet.py --help`` described none of its options."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))
# An option line of argparse's help: the flags, their metavar, then (maybe) its text.
OPTION = re.compile(r"^  (-[-\w]+(?: [A-Z_]+)?(?:, -[-\w]+(?: [A-Z_]+)?)*)(\s{2,}\S.*)?$")


def _undescribed(help_text: str) -> list[str]:
    lines = help_text.splitlines()
    missing = []
    for i, line in enumerate(lines):
        found = OPTION.match(line)
        if found is None or found.group(1).startswith("-h"):
            continue
        follows = lines[i + 1] if i + 1 < len(lines) else ""
        described = found.group(2) is not None or follows.startswith(" " * 8)
        if not described:
            missing.append(found.group(1))
    return missing


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_benchmark_starts_and_describes_its_options(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _undescribed(done.stdout) == [], done.stdout
