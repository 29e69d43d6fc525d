"""Tests that need what only some machines give (root, a mount): skipped on a laptop, failed in CI.

Not a test module. A skip in CI reads as a pass: the root-only fault tests (a full tmpfs, a
read-only mount) would then never run where they are meant to run. As PostgreSQL does with
``PIPELINE_REQUIRE_PG``, CI turns "cannot run here" into a failure: ``CI`` set to anything
but ``""``/``0``/``false`` (CI services set ``CI=true``), or ``PIPELINE_REQUIRE_ROOT=1``.
"""

import os
from typing import NoReturn

import pytest

_OFF = ("", "0", "false")


def in_ci() -> bool:
    """True where a test that cannot run must fail instead of being skipped."""
    ci = os.environ.get("CI", "").strip().lower()
    required = os.environ.get("PIPELINE_REQUIRE_ROOT", "").strip().lower()
    return ci not in _OFF or required not in _OFF


def skip_or_fail(message: str) -> NoReturn:
    """Skip the test here; fail it in CI (see :func:`in_ci`), naming what was missing."""
    if in_ci():
        pytest.fail(f"{message} (a skip is a failure in CI)", pytrace=False)
    pytest.skip(message)
