"""A snapshot of the shipped ``Definitions``.

Any change to what the code location exposes — an asset key, a dependency, the partitions,
a check, a sensor and the jobs it targets, a schedule, a resource — shows up as a diff of
``tests/core/snapshots/definitions.json`` in review. After an intended change, regenerate it:

    UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/core/test_definitions_snapshot.py
"""

import json
import os
from pathlib import Path
from typing import Any

import dagster as dg

from pipeline_defs.definitions import build_defs

SNAPSHOT = Path(__file__).with_name("snapshots") / "definitions.json"


def describe(defs: dg.Definitions) -> dict[str, Any]:
    graph = defs.resolve_asset_graph()
    assets: dict[str, Any] = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        partitions = node.partitions_def
        assets[key.to_user_string()] = {
            "deps": sorted(k.to_user_string() for k in node.parent_keys),
            "group": node.group_name,
            "partitions": None
            if partitions is None
            else {
                "type": type(partitions).__name__,
                "name": getattr(partitions, "name", None),
            },
            "checks": sorted(c.name for c in node.check_keys),
            "io_manager_key": defs.resolve_assets_def(key).get_io_manager_key_for_asset_key(key),
            "kinds": sorted(node.kinds),
        }
    sensors = {
        sensor.name: {
            "jobs": sorted(job.name for job in sensor.jobs) if sensor.has_jobs else [],
            "minimum_interval_seconds": sensor.minimum_interval_seconds,
            "default_status": sensor.default_status.value,
            "required_resources": sorted(sensor.required_resource_keys),
        }
        for sensor in defs.sensors or []
    }
    resources = {key: type(value).__name__ for key, value in sorted((defs.resources or {}).items())}
    jobs = sorted(job.name for job in defs.resolve_all_job_defs())
    schedules = {}
    for schedule in defs.schedules or []:
        # Declared on a named job (no asset job left to resolve): its job name is known.
        assert isinstance(schedule, dg.ScheduleDefinition), schedule
        schedules[schedule.name] = {
            "job": schedule.job_name,
            "cron": schedule.cron_schedule,
            "default_status": schedule.default_status.value,
        }
    return {
        "assets": assets,
        "sensors": sensors,
        "resources": resources,
        "jobs": jobs,
        "schedules": schedules,
    }


def test_definitions_match_the_snapshot() -> None:
    current = describe(build_defs())
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(json.dumps(current, indent=2, sort_keys=True) + "\n")
    expected = json.loads(SNAPSHOT.read_text())
    assert current == expected, (
        "the shipped Definitions changed; if intended, regenerate with "
        "UPDATE_SNAPSHOTS=1 (see this module's docstring)"
    )
