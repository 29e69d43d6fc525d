"""The pieces of ``benchmarks/resume_cost.py``: its report (the tables, the targets
checked, the bar chart).
"""

from collections.abc import Mapping
from pathlib import Path

from resume_cost_env import POLICIES, POLICY_NAMES
from resume_cost_policies import Cost


# ----------------------------------------------------------------------------- reporting
def cell(cost: Cost) -> str:
    blocked = f", blocked: {', '.join(cost.blocked)}" if cost.blocked else ""
    return f"{cost.text}/{cost.image} ({cost.executions} exec{blocked})"


def markdown_table(results: Mapping[str, Mapping[str, Cost]], titles: Mapping[str, str]) -> str:
    lines = [
        "| scenario | policy | text calls | image calls | total calls "
        "| step executions | blocked? | seconds |",
        "|---|---|---:|---:|---:|---:|---|---:|",
    ]
    for sid, row in results.items():
        for policy in POLICIES:
            cost = row[policy]
            blocked = ("yes: " + ", ".join(cost.blocked)) if cost.blocked else "no"
            seconds = f"{cost.seconds:.1f}" if policy != "d" else "—"
            lines.append(
                f"| {sid} {titles[sid]} | {POLICY_NAMES[policy]} | {cost.text} | {cost.image} "
                f"| {cost.calls} | {cost.executions} | {blocked} | {seconds} |"
            )
    return "\n".join(lines)


def compact_table(results: Mapping[str, Mapping[str, Cost]]) -> str:
    """Scenario rows, one column per policy: text/image calls (step executions)."""
    head = "| scenario | " + " | ".join(POLICY_NAMES[p] for p in POLICIES) + " |"
    lines = [head, "|---|" + "---|" * len(POLICIES)]
    for sid, row in results.items():
        lines.append(f"| {sid} | " + " | ".join(cell(row[p]) for p in POLICIES) + " |")
    return "\n".join(lines)


def check_targets(results: Mapping[str, Mapping[str, Cost]]) -> list[tuple[str, bool, str]]:
    checks: list[tuple[str, bool, str]] = []
    for sid, row in results.items():
        a, d = row["a"], row["d"]
        same = (a.text, a.image, a.executions, bool(a.blocked)) == (
            d.text,
            d.image,
            d.executions,
            bool(d.blocked),
        )
        checks.append(
            (
                f"{sid}: (a) = (d)",
                same,
                f"ours {a.text}/{a.image} calls, {a.executions} exec"
                f"{' blocked' if a.blocked else ''}; oracle {d.text}/{d.image} calls, "
                f"{d.executions} exec{' blocked' if d.blocked else ''}",
            )
        )
    for sid in ("S1", "S4"):
        if sid not in results:
            continue
        a = results[sid]["a"]
        for other in ("b", "c"):
            o = results[sid][other]
            ok = o.calls > 0 and a.calls * 5 <= o.calls
            if o.calls == 0:
                why = "it makes 0 calls too: nothing to be 5x fewer than"
            else:
                ratio = "inf" if a.calls == 0 else f"{o.calls / a.calls:.1f}"
                why = f"ours {a.calls} vs {o.calls} calls: {ratio}x"
            checks.append((f"{sid}: (a) >= 5x fewer calls than ({other})", ok, why))
    return checks


SHORT = {
    "S1": "review fixed prompts",
    "S2": "1 composite PNG lost",
    "S3": "image PNGs lost",
    "S4": "title edited",
    "S5": "scene_detail key edited",
    "S6a": "SIGKILL (redraw run)",
    "S6b": "SIGKILL (first run)",
}


def save_chart(
    results: Mapping[str, Mapping[str, Cost]], path: Path, titles: Mapping[str, str]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sids = list(results)
    colors = {"a": "#2b8a3e", "b": "#c92a2a", "bj": "#862e9c", "c": "#e67700", "d": "#495057"}
    width = 0.16
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=90)
    for i, policy in enumerate(POLICIES):
        xs = [n + (i - (len(POLICIES) - 1) / 2) * width for n in range(len(sids))]
        values = [results[s][policy].calls for s in sids]
        bars = ax.bar(xs, values, width, label=POLICY_NAMES[policy], color=colors[policy])
        for bar, sid in zip(bars, sids, strict=True):
            cost = results[sid][policy]
            label = f"{cost.calls}" + ("\nblocked" if cost.blocked else "")
            ax.annotate(
                label,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=6.5,
            )
    ax.set_xticks(range(len(sids)))
    ax.set_xticklabels([f"{s}\n{SHORT.get(s, titles[s][:18])}" for s in sids], fontsize=7.5)
    ax.set_ylabel("provider calls (text + image)")
    ax.set_title("Resume cost per scenario: provider calls by policy", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    ax.margins(y=0.12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
