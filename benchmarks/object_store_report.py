"""The pieces of ``benchmarks/object_store.py``: the report of the tick part."""

import statistics
from collections import Counter
from typing import Any

from object_store_fixture import FULL_REFRESH


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k.upper()}" for k, n in sorted(counts.items())) or "0"


def _sum(ticks: list[dict[str, Any]], share: str) -> dict[str, int]:
    total: Counter[str] = Counter()
    for t in ticks:
        total.update(t[share])
    return dict(total)


def report_ticks(result: dict[str, Any], fixture: dict[str, Any]) -> None:
    episodes, steps = result["episodes"], result["steps"]
    slots = episodes * steps
    ticks = result["ticks"]
    interval, period = result["interval"], result["scrub_period"]
    print(
        f"\nsensor ticks: {episodes} episodes x {steps} steps on S3 (moto), "
        f"{fixture['objects_per_episode']} objects per episode; one episode run for real in "
        f"{fixture['run_seconds']} s, replicated in {fixture['replicate_seconds']} s; "
        f"ticks {interval:g} s apart (simulated), scrub period {period:g} s: "
        f"{2 * episodes * interval / period:.1f} LISTs per tick expected"
    )
    if "warning" in result:
        print(f"  WARNING: {result['warning']}")
    print(
        "| ticks | n | partitions re-judged | scrub requests | other requests | "
        "other per tick per (step, partition) | launches | blocks | wall per tick |"
    )
    print("|---|---|---:|---|---|---:|---:|---:|---:|")

    def row(label: str, group: list[dict[str, Any]]) -> None:
        if not group:
            return
        other = _sum(group, "other")
        scrub = [sum(t["scrub"].values()) for t in group]
        n = len(group)
        walls = [t["wall"] for t in group]
        per = sum(other.values()) / n / slots
        engine = statistics.median(t["engine"] for t in group)
        in_scrub = statistics.median(t["request_seconds"].get("scrub", 0.0) for t in group)
        wall = (
            f"{statistics.median(walls):.2f} s"
            + (f" (median of {n}; {min(walls):.2f}-{max(walls):.2f})" if n > 1 else "")
            + f"; tick engine {engine:.2f} s, scrub's requests {in_scrub:.2f} s"
        )
        scrub_text = _fmt(_sum(group, "scrub")) + (
            f" ({min(scrub)}-{max(scrub)} per tick, mean {sum(scrub) / n:.1f})" if n > 1 else ""
        )
        other_text = _fmt(other) + (" in all" if n > 1 and other else "")
        rejudged = sum(t["rejudged"] for t in group)
        print(
            f"| {label} | {n} | {rejudged} | {scrub_text} | {other_text} | {per:.5f} | "
            f"{sum(t['launches'] for t in group)} | {sum(t['blocks'] for t in group)} | {wall} |"
        )

    labels = {
        "cold": "cold (empty scratch)",
        "warm": "warm, nothing changed",
        "changed": "after 1 % changed",
        "after": "then, nothing more changed",
        "config": "project.yaml replaced in the bucket",
    }
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for t in ticks:
        groups.setdefault((t["phase"], t["mode"]), []).append(t)
    changed = [t for t in ticks if t["phase"] == "changed"]
    order = list(groups)
    for i, (phase, mode) in enumerate(order):
        row(f"{labels[phase]}: {mode} ticks", groups[(phase, mode)])
        if phase == "changed" and (i + 1 == len(order) or order[i + 1][0] != "changed"):
            row("after 1 % changed: every tick until all seen", changed)
    detected = result["detected"]
    print(f"\nchanges ({len(result['changes'])}), detected after how many ticks:")
    for pk, kind in result["changes"].items():
        found = detected.get(pk)
        seen = f"tick {found['tick']} ({found['what']})" if found else "NOT detected"
        print(f"  {pk:14s} {kind:18s} {seen}")
    if "config_edit" in result:
        edit = result["config_edit"]
        print(
            f"\nproject.yaml replaced in the bucket: read by the sensor at tick "
            f"{edit.get('read', 'never')}, acted on at tick {edit.get('acted', 'never')} "
            f"({edit.get('mode')}: {edit.get('launches')} launches, {edit.get('blocks')} "
            f"blocks); full refresh every {FULL_REFRESH:g} s = "
            f"{FULL_REFRESH / interval:g} ticks"
        )
    print("\nticks that re-judged (requests outside the scrub):")
    for t in ticks:
        if t["mode"] != "unchanged":
            print(
                f"  tick {t['n']:3d} {t['mode']:11s} re-judged {t['rejudged']:4d}: "
                f"{_fmt(t['other'])}; scrub {_fmt(t['scrub'])}; {t['launches']} launches, "
                f"{t['blocks']} blocks, {t['wall']:.2f} s; why: {t['why']}"
            )
    print("\ncall sites of the requests outside the scrub (phase/mode: count):")
    for where, sites in result["sites"].items():
        for site, count in sorted(sites.items(), key=lambda kv: -kv[1]):
            print(f"  {where:22s} {count:5d}  {site}")
