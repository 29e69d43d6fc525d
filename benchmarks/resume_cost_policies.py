"""The pieces of ``benchmarks/resume_cost.py``: what a policy costs (``Cost``, read back
from the ledger by ``measure``), the policies (a), (b), (b*), (c) and the oracle (d).
"""

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run on its own too (tests/core runs every file)
    sys.path.insert(0, str(ROOT))

from resume_cost_env import (  # noqa: E402
    CLAIMS,
    EPISODE,
    EPISODE_ID,
    IMAGE_STEPS,
    PROJECT,
    STEP_IDS,
    Env,
    downstream_of,
    failures,
)

from pipeline_defs.project import load_project_config  # noqa: E402
from pipeline_defs.resume.decision_types import LaunchMode, ResumeAction  # noqa: E402
from pipeline_defs.resume.files import file_sha256  # noqa: E402
from resources.checkpoints.envelope import mask_secrets  # noqa: E402


# ----------------------------------------------------------------------------- measuring
@dataclass
class Cost:
    text: int = 0
    image: int = 0
    executions: int = 0
    executed: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def calls(self) -> int:
        return self.text + self.image


def measure(env: Env, action: Callable[[Env, Cost], None]) -> Cost:
    """Run ``action`` and read back what it cost from the ledger (calls, claims, blocks)."""
    ledger = env.ledger
    seq = ledger.cursor()[0]
    last_call = max((c["id"] for c in ledger.provider_calls(episode=EPISODE)), default=0)
    cost = Cost()
    started = time.perf_counter()
    action(env, cost)
    cost.seconds = time.perf_counter() - started
    for row in ledger.transitions(since_seq=seq):
        if row.episode_id != EPISODE_ID:
            continue
        if row.action in CLAIMS:
            cost.executions += 1
            cost.executed.append(f"{row.step_id}:{row.action}")
        elif row.action == "block" and row.step_id not in cost.blocked:
            cost.blocked.append(row.step_id)
    for call in ledger.provider_calls(episode=EPISODE):
        if call["id"] > last_call:
            if call["kind"] == "text":
                cost.text += 1
            else:
                cost.image += 1
    return cost


def shadow_doubts(env: Env) -> dict[str, str]:
    """step → the judge's non-SKIP action, judged read-only for every step."""
    doubts: dict[str, str] = {}
    rows = {k.step_id: r for k, r in env.ledger.get_many(episodes=[EPISODE]).items()}
    for step_id in STEP_IDS:
        try:
            judgement = env.judge(step_id).judge(
                env.key(step_id), mode=LaunchMode.RESUME, row=rows.get(step_id)
            )
            action = judgement.decision.action
        except Exception as exc:  # a crashing verifier is a doubt too
            doubts[step_id] = f"raised {type(exc).__name__}"
            continue
        if action is not ResumeAction.SKIP:
            doubts[step_id] = action.value
    return doubts


def policy_ours(env: Env, cost: Cost) -> None:
    cost.notes.extend(failures(env.materialize()))


def drift_doubts(env: Env) -> dict[str, str]:
    """The doubts a pre-project resume saw (docs/DESIGN.md#problem): hash and whole-config drift.

    A checkpoint edited in place after it was produced (``mutations``) no longer has the
    content hash it was published with; a step whose masked config snapshot differs from the
    current project file saw "the config changed" (no scoped hash before this project).
    """
    config = mask_secrets(load_project_config(env.home, PROJECT).as_dict())
    doubts: dict[str, str] = {}
    for step_id in STEP_IDS:
        checkpoint = env.checkpoints.load(env.key(step_id))
        if checkpoint is None:
            continue
        if checkpoint.mutations:
            doubts[step_id] = "content hash drift (mutated)"
        elif dict(checkpoint.project_config_snapshot) != config:
            doubts[step_id] = "project config hash drift"
    return doubts


def policy_naive(env: Env, cost: Cost, *, judge_only: bool = False) -> None:
    doubts = shadow_doubts(env)
    if not judge_only:
        doubts = {**drift_doubts(env), **doubts}
        doubts = {s: doubts[s] for s in STEP_IDS if s in doubts}
    cost.notes.append(
        "doubts: " + (", ".join(f"{s}={a}" for s, a in doubts.items()) or "none (all SKIP)")
    )
    if doubts:
        forced = env.materialize(list(doubts), force=True)
        cost.notes.extend(f"force run: {f}" for f in failures(forced))
    cost.notes.extend(f"resume run: {f}" for f in failures(env.materialize()))


def policy_plain(affected: Sequence[str], reset_running: bool) -> Callable[[Env, Cost], None]:
    def run(env: Env, cost: Cost) -> None:
        selection = downstream_of(affected)
        cost.notes.append(f"forced set: {', '.join(selection)}")
        if reset_running:  # plain Dagster has no lease that would refuse the re-run
            for step_id in selection:
                row = env.ledger.get(env.key(step_id))
                if row is not None and row.status == "running":
                    env.ledger.reset_running(
                        env.key(step_id), row.started_at, "benchmark: plain Dagster, no lease"
                    )
                    cost.notes.append(f"lease of {step_id} reset first")
        cost.notes.extend(failures(env.materialize(selection, force=True)))

    return run


def oracle(base: Env, state: Env, *, blocked: Sequence[str] = ()) -> Cost:
    """Minimum work: each image recorded by the template but missing/invalid now, drawn once."""
    cost = Cost(blocked=list(blocked))
    for step_id in IMAGE_STEPS:
        template = base.checkpoints.load(base.key(step_id))
        assert template is not None, step_id
        missing = 0
        for entry in (template.data.get("images") or {}).values():
            path = state.step_dir(step_id) / entry["path"]
            if not path.is_file() or file_sha256(path) != entry["sha256"]:
                missing += 1
        if missing:
            cost.image += missing
            cost.executions += 1
            cost.executed.append(f"{step_id} ({missing} images)")
    if blocked:
        cost.notes.append("blocked by design: an explicit force is the user's decision")
    return cost
