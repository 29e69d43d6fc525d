"""A bucket costs what a disk costs: the same operator commands, the same provider calls.

Every command is its own ``storyboard`` process, as an operator runs them: on a bucket a
new process starts with an empty scratch copy, so what a step reuses must come from the
bucket itself (docs/DESIGN.md#storage). Run on a local home and on S3 (moto) from one
parametrized fixture, with the same expected figures.
"""

import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import CliEnv, make_env

from pipeline_defs.storyboard import sample_stories

PARTITION = "demo/ep01"


def storyboard(cli: CliEnv, storage_url: str | None, *args: str) -> str:
    env = {**cli.subprocess_env()}
    env.pop("STORYBOARD_DEFS", None)  # the shipped code location
    if storage_url is not None:
        env["PIPELINE_STORAGE_URL"] = storage_url
    done = subprocess.run(
        [str(Path(sys.executable).with_name("storyboard")), *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=cli.root,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout


@pytest.fixture
def cli_built(tmp_path: Path, storage_url: str | None) -> CliEnv:
    """The sample episode registered and run end to end by the CLI."""
    cli = make_env(tmp_path)
    story = str(sample_stories()["ep01"])
    storyboard(cli, storage_url, "add-episode", "--project", "demo", "--episode", "ep01",
               "--story", story)  # fmt: skip
    storyboard(cli, storage_url, "materialize", "--partition", PARTITION)
    return cli


def calls(cli: CliEnv) -> int:
    return len(cli.ledger.provider_calls())


# (the step forced, the calls its force and the resume after it pay on a local home)
FORCES = (
    # The review re-run: one call; every picture downstream of it is kept (the prompts it
    # leaves are the same).
    ("t2i_review", 1),
    # The world guide again (1) and the steps whose prompts it feeds (6 calls); every
    # picture whose prompt did not change is kept.
    ("world_guide", 7),
)


def test_a_force_then_a_resume_costs_the_same_on_a_bucket_as_on_disk(
    cli_built: CliEnv, storage_url: str | None
) -> None:
    for step, paid in FORCES:  # one episode per backend, forced twice in turn
        before = calls(cli_built)
        storyboard(cli_built, storage_url, "force", "--partition", PARTITION, "--step", step)
        storyboard(cli_built, storage_url, "materialize", "--partition", PARTITION)
        assert calls(cli_built) - before == paid, (step, cli_built.ledger.provider_calls()[before:])
        again = calls(cli_built)
        storyboard(cli_built, storage_url, "materialize", "--partition", PARTITION)
        assert calls(cli_built) == again, step  # and then nothing
