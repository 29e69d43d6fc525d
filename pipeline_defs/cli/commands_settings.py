"""``storyboard migrate`` and ``storyboard settings show|set``: the ledger's schema and the
judge's limits the ledger keeps."""

import os
from typing import Any

import click

from pipeline_defs.cli.app import checked_workspace, main
from pipeline_defs.cli.render import render_table
from pipeline_defs.cli.shared import operation
from pipeline_defs.operations.workspace import load_workspace, safe_url
from pipeline_defs.resume.settings import ENV_NAMES, LEDGER_KEYS, env_ledger_values
from pipeline_defs.resume.settings_registry import read
from resources.ledger.store import worker


@main.command()
@operation("migrate")
def migrate(*, as_json: bool) -> dict[str, Any] | None:
    """Bring the ledger database to the head schema revision."""
    ws = checked_workspace()
    revision = ws.ledger.migrate()
    # Seeds only keys the table does not hold: an operator's `settings set` is never
    # overwritten by a variable that happens to be set where migrate runs.
    seeds = env_ledger_values()
    seeded = ws.ledger.seed_settings(
        seeds, changed_by={k: f"storyboard migrate ({ENV_NAMES[k]}) {_operator()}" for k in seeds}
    )
    payload = {
        "ledger": safe_url(ws.ledger.url),
        "revision": revision,
        "seeded_settings": {k: new for k, (_, new) in seeded.items()},
    }
    if not as_json:
        click.echo(f"ledger {payload['ledger']} is at revision {revision}")
        for key, (_, new) in seeded.items():
            click.echo(f"seeded ledger setting {key}={new} from {ENV_NAMES[key]}")
    return payload


def _operator() -> str:
    """Who changes a setting, for its audit row: user and host/process."""
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "unknown"
    return f"by {user} on {worker()}"


@main.group("settings")
def settings_group() -> None:
    """The judge's limits kept in the ledger, shared by the sensor and every run worker.

    In force: a PIPELINE_* variable where set (per process), else the ledger's value, else
    the default. Every change is audited (table setting_change).
    """


@settings_group.command("show")
@operation("settings show")
def settings_show(*, as_json: bool) -> dict[str, Any] | None:
    """Every PIPELINE_* setting, its value in force and where it came from (resource, env,
    ledger, default); the ledger holds the judge's limits (settings set)."""
    ws = load_workspace()  # not checked_workspace(): no refusal on the pair it is there to show
    effective = ws.effective_settings
    every = effective.registry_rows()
    if as_json:
        return {
            "ledger": safe_url(ws.ledger.url),
            "settings": effective.rows(),  # the ledger-held ones, values typed
            "variables": every,
        }
    click.echo(
        render_table(
            ["setting", "value", "source", "variable"],
            [(r["key"], r["value"], r["source"], r["variable"]) for r in every],
        )
    )
    click.echo(f"held in the ledger (storyboard settings set): {', '.join(LEDGER_KEYS)}")
    return None


# ignore_unknown_options: `settings set lease_seconds -1` must reach the bounds check and
# be refused by them ("greater than 0"), not by click as an unknown option "-1".
@settings_group.command("set", context_settings={"ignore_unknown_options": True})
@click.argument("key")
@click.argument("value")
@operation("settings set")
def settings_set(*, key: str, value: str, as_json: bool) -> dict[str, Any] | None:
    """Set KEY to VALUE in the ledger (validated with the same bounds as the variables)."""
    ws = load_workspace()  # not checked_workspace(): it repairs the ledger's half of a broken pair
    ws.require_migrated_ledger()
    old, new = ws.ledger.set_setting(
        key, value, changed_by=f"storyboard settings set {_operator()}"
    )
    overridden = bool(read(ENV_NAMES[key]).strip())
    if as_json:
        return {"key": key, "old": old, "new": new, "overridden_here_by_env": overridden}
    click.echo(f"ledger setting {key}: {old if old is not None else '(unset)'} -> {new}")
    if overridden:
        click.echo(
            f"note: {ENV_NAMES[key]} is set in this environment and overrides it for "
            "processes that have it set",
            err=True,
        )
    return None
