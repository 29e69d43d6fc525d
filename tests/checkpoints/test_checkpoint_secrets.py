"""Secrets in the project config never reach PIPELINE_HOME, the ledger or Dagster events."""

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from judge_steps import Alpha, failure, open_harness

from pipeline_defs.resume.status import StepStatus
from resources.checkpoints.envelope import MASK, Checkpoint, mask_secrets
from resources.ledger.tables import provider_call, step_run, step_transition

SECRET = "sk-live-7f3c9a1e5b2d4c6a8e0f"
ROTATED = "sk-live-rotated-0a9b8c7d6e5f"


def write_project(home: Path, api_key: str) -> Path:
    path = home / "projects" / "proj1" / "project.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {"style": "ink", "provider": {"kind": "offline", "api_key": api_key}},
        )
    )
    return path


def test_no_secret_value_anywhere_under_home_ledger_or_event_log(
    db_url: str, pipeline_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # alpha's config hash even covers the key: only a fingerprint may be stored, never the value
    monkeypatch.setattr(Alpha, "resume_config_keys", ("style", "provider.api_key"))
    project_file = write_project(pipeline_home, SECRET)
    with open_harness(pipeline_home, db_url, persistent=True) as h:
        runs = [h.run("alpha", "beta", "gamma"), h.run("alpha", "beta")]
        assert all(r.success for r in runs)
        envelope = h.envelope("alpha")
        assert envelope["project_config_snapshot"]["provider"]["api_key"] == MASK
        assert set(envelope["config_fingerprints"]) == {"style", "provider.api_key"}

        # a rotated key is a scoped config change: the BLOCK names the key, not the values
        write_project(pipeline_home, ROTATED)
        blocked = h.run("alpha")
        assert not blocked.success
        description, _ = failure(blocked, "alpha")
        assert "provider.api_key" in description
        # failure and force paths write error texts and audit rows too
        h.knobs("beta", **{"raise": "provider refused the request"})
        failed = h.run("beta", tags={"resume/mode": "force"})
        assert not failed.success
        runs += [blocked, failed]

        needles = (SECRET.encode(), ROTATED.encode())
        for path in tmp_path.rglob("*"):  # PIPELINE_HOME and, for SQLite, the ledger file
            if path.is_file() and path != project_file:
                payload = path.read_bytes()
                assert not any(n in payload for n in needles), f"secret found in {path}"
        with h.ledger.engine.connect() as conn:
            for table in (step_run, step_transition, provider_call):
                text = repr(conn.execute(sa.select(table)).all())
                assert SECRET not in text and ROTATED not in text, table.name
        for result in runs:
            for entry in h.instance.all_logs(result.run_id):
                serialized = dg.serialize_value(entry)
                assert SECRET not in serialized and ROTATED not in serialized
            run = h.instance.get_run_by_id(result.run_id)
            assert SECRET not in dg.serialize_value(run)


def test_mask_secrets_masks_every_depth_and_leaves_the_rest() -> None:
    config: dict[str, Any] = {
        "title": "ok",
        "provider": {"api_key": SECRET, "Base_URL": "http://x", "API_KEY_FILE": "/k"},
        "deep": {
            "list": [{"db_password": "p1"}, {"nested": {"GitHub_Token": "t1"}}, "plain"],
            "client_secret": "s1",
            "aws_credentials": {"key": "c1", "id": "c2"},
            "tokenizer": "t2",
            "unset_api_key": None,
            "empty_password": "",
        },
    }
    masked = mask_secrets(config)
    assert masked["title"] == "ok"
    assert masked["provider"] == {"api_key": MASK, "Base_URL": "http://x", "API_KEY_FILE": MASK}
    deep = masked["deep"]
    assert deep["list"] == [{"db_password": MASK}, {"nested": {"GitHub_Token": MASK}}, "plain"]
    assert deep["client_secret"] == MASK
    assert deep["aws_credentials"] == MASK  # a whole secret section, not its children
    assert deep["tokenizer"] == MASK  # contains "token": masked, erring on the safe side
    assert deep["unset_api_key"] is None and deep["empty_password"] == ""  # nothing to hide
    rendered = repr(masked)
    for value in (SECRET, "p1", "t1", "s1", "c1", "c2"):
        assert value not in rendered
    assert config["provider"]["api_key"] == SECRET  # the input is not modified


def test_the_envelope_masks_its_snapshot_even_if_handed_an_unmasked_one() -> None:
    checkpoint = Checkpoint(
        step_id="alpha",
        project_id="proj1",
        episode_id="ep1",
        status=StepStatus.COMPLETED,
        schema_version=1,
        config_hash="h",
        resume_config_keys=(),
        config_fingerprints={},
        project_config_snapshot={"provider": {"api_key": SECRET}, "x": [{"token": "t1"}]},
        data={},
    )
    text = checkpoint.to_json()
    assert SECRET not in text and "t1" not in text
    assert '"api_key": "***"' in text
