"""``storyboard settings show`` lists every row of the settings registry: its value in force
(secrets hidden), where it came from and its variable; ``--json`` keeps the ledger-held
settings typed (``settings``) and adds every row (``variables``)."""

from cli_helpers import CliEnv

from pipeline_defs.resume.settings import LEDGER_KEYS
from pipeline_defs.resume.settings_registry import SETTINGS


def test_settings_show_lists_every_registry_row(cli_db: CliEnv) -> None:
    cli_db.ok("migrate")
    cli_db.ok("settings", "set", "lease_seconds", "90")
    env = {"PIPELINE_PROVIDER_API_KEY": "sk-never-printed", "PIPELINE_CELERY_QUEUE": "q1"}
    shown = cli_db.invoke("settings", "show", env=env)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    for setting in SETTINGS:
        (line,) = [ln for ln in lines if ln.split()[:1] == [setting.key]]
        assert line.split()[-1] == setting.var, line
    assert "sk-never-printed" not in shown.output
    by_key = {ln.split()[0]: ln.split() for ln in lines if ln.split()}
    assert by_key["lease_seconds"][1:3] == ["90", "ledger"]
    assert by_key["celery_queue"][1:3] == ["q1", "env"]
    assert by_key["provider_api_key"][1:3] == ["(set)", "env"]

    payload = cli_db.json("settings", "show")
    assert [row["key"] for row in payload["variables"]] == [s.key for s in SETTINGS]
    assert [row["key"] for row in payload["settings"]] == list(LEDGER_KEYS)
