"""The pieces of ``benchmarks/resume_cost.py``: the scenarios S1-S6b, each a state
prepared from a copy of the template (S6: a run killed with SIGKILL mid step).
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run on its own too (tests/core runs every file)
    sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402
from resume_cost_env import EPISODE_ID, IMAGE_STEPS, PROJECT, SHOT_STEP, STEP_IDS, Env  # noqa: E402

from pipeline_defs.resume.clock import parse_timestamp  # noqa: E402
from resources.ledger.tables import step_run  # noqa: E402
from resources.providers.base import LATENCY_ENV  # noqa: E402

# The script itself: its ``--child-run`` is the run S6 kills.
SCRIPT = Path(__file__).resolve().with_name("resume_cost.py")


# ----------------------------------------------------------------------------- scenarios
@dataclass
class Scenario:
    sid: str
    title: str
    prepare: Callable[[Env], Env]  # template → a new env holding the scenario state
    affected: tuple[str, ...]
    reset_running_for_plain: bool = False
    oracle_blocked: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)


def delete_pngs(env: Env, step_ids: Iterable[str]) -> int:
    count = 0
    for step_id in step_ids:
        for png in sorted(env.step_dir(step_id).rglob("*.png")):
            if "archive" not in png.relative_to(env.step_dir(step_id)).parts:
                png.unlink()
                count += 1
    return count


def prepare_with(edit: Callable[[Env], None]) -> Callable[[Env], Env]:
    def prepare(base: Env) -> Env:
        env = base.clone()
        edit(env)
        return env

    return prepare


def edit_s2(env: Env) -> None:
    composites = sorted((env.step_dir("composite_image_gen") / "composites").glob("*.png"))
    composites[-1].unlink()


def edit_s3(env: Env) -> None:
    delete_pngs(env, IMAGE_STEPS)


def kill_mid_run(
    base: Env,
    *,
    first_run: bool,
    kill_after: int,
    latency_ms: int,
    running_timeout: int,
    facts: dict[str, Any],
) -> Env:
    env = base.clone()
    env.running_timeout = running_timeout
    shots = env.step_dir(SHOT_STEP) / "shots"
    expected = len(list(shots.glob("*.png")))
    if first_run:  # the step has never completed: no checkpoint, no PNGs, no ledger row
        shutil.rmtree(env.step_dir(SHOT_STEP))
        with env.ledger.engine.begin() as conn:
            conn.execute(
                sa.delete(step_run).where(
                    step_run.c.project_id == PROJECT,
                    step_run.c.episode_id == EPISODE_ID,
                    step_run.c.step_id == SHOT_STEP,
                )
            )
    else:  # the shots were lost; the resume that redraws them is the run killed
        delete_pngs(env, [SHOT_STEP])
    calls_before = len(env.ledger.provider_calls(env.key(SHOT_STEP)))
    env.dispose()
    log_path = env.root / "child.log"
    child_env = {**os.environ, LATENCY_ENV: str(latency_ms)}
    child_args = [str(env.home), env.db_url]
    with log_path.open("wb") as log:
        child = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--child-run", *child_args],
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        try:
            while True:
                written = len(list(shots.glob("*.png"))) if shots.is_dir() else 0
                if written >= kill_after:
                    os.kill(child.pid, signal.SIGKILL)
                    break
                if child.poll() is not None:
                    raise RuntimeError(
                        "the run finished before it could be killed: "
                        + log_path.read_text()[-2000:]
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError("the run to kill wrote no PNG in 300 s")
                time.sleep(0.02)
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
            child.wait()
    row = env.ledger.get(env.key(SHOT_STEP))
    assert row is not None and row.status == "running", row
    written = len(list(shots.glob("*.png")))
    facts.update(
        {
            "expected_shots": expected,
            "shots_on_disk_at_kill": written,
            "killed_run_image_calls": len(env.ledger.provider_calls(env.key(SHOT_STEP)))
            - calls_before,
            "killed_returncode": child.returncode,
        }
    )
    # Wait until the dead run's lease (its last heartbeat, else its start) is older than the
    # running timeout, its lease.
    started = parse_timestamp(row.heartbeat_at) or parse_timestamp(row.started_at)
    assert started is not None
    wait = running_timeout + 0.5 - (datetime.now(UTC) - started).total_seconds()
    if wait > 0:
        time.sleep(wait)
    return env


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    def kill(first_run: bool, facts: dict[str, Any]) -> Callable[[Env], Env]:
        def prepare(base: Env) -> Env:
            return kill_mid_run(
                base,
                first_run=first_run,
                kill_after=args.kill_after,
                latency_ms=args.latency_ms,
                running_timeout=args.running_timeout,
                facts=facts,
            )

        return prepare

    s6a: dict[str, Any] = {}
    s6b: dict[str, Any] = {}
    return [
        Scenario(
            "S1",
            "after t2i_review fixed prompts, resume all",
            prepare_with(lambda env: None),
            ("scene_detail", "entity_t2i"),
        ),
        Scenario(
            "S2", "one composite PNG deleted", prepare_with(edit_s2), ("composite_image_gen",)
        ),
        Scenario(
            "S3",
            "image checkpoints restored without their PNGs",
            prepare_with(edit_s3),
            IMAGE_STEPS,
        ),
        Scenario(
            "S4",
            "unrelated config key edited (title)",
            prepare_with(lambda env: env.edit_config("title", "A retitled project")),
            STEP_IDS,
        ),
        Scenario(
            "S5",
            "scene_detail's own key edited (scenes.camera_style)",
            prepare_with(lambda env: env.edit_config("scenes.camera_style", "handheld 16mm")),
            ("scene_detail",),
            oracle_blocked=("scene_detail",),
        ),
        Scenario(
            "S6a",
            "SIGKILL mid scene_image_pipeline (redraw of lost shots), recover",
            kill(False, s6a),
            (SHOT_STEP,),
            reset_running_for_plain=True,
            facts=s6a,
        ),
        Scenario(
            "S6b",
            "SIGKILL mid scene_image_pipeline (its first run), recover",
            kill(True, s6b),
            (SHOT_STEP,),
            reset_running_for_plain=True,
            facts=s6b,
        ),
    ]
