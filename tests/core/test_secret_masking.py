"""Secrets inside URL values are masked too, not only values under secret-looking keys.

``provider.base_url: https://user:KEY@host/v1`` or ``…/v1?api_key=KEY`` sits under a key
(``base_url``) that names no secret, so before the fix the key reached every checkpoint's
``project_config_snapshot`` in plain text.
"""

from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from judge_steps import open_harness

from resources.checkpoints.envelope import MASK, mask_secrets
from resources.ledger.tables import provider_call, step_run, step_transition

KEY = "sk-live-url-3c9a1e5b2d4c6a8e"
PASSWORD = "pw-url-9f8e7d6c5b4a"
QUERY_KEY = "sk-query-0a1b2c3d4e5f"
TOKEN = "tok-query-6a7b8c9d0e1f"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param(
            f"https://user:{KEY}@api.example.com/v1",
            "https://***@api.example.com/v1",
            id="userinfo-password",
        ),
        pytest.param(
            f"https://{KEY}@api.example.com:8443/v1/",
            "https://***@api.example.com:8443/v1/",
            id="userinfo-user-only",
        ),
        pytest.param(
            f"https://api.example.com/v1?api_key={KEY}",
            f"https://api.example.com/v1?api_key={MASK}",
            id="query-api_key",
        ),
        pytest.param(
            f"https://api.example.com/v1?key={KEY}&model=gpt&token={TOKEN}",
            f"https://api.example.com/v1?key={MASK}&model=gpt&token={MASK}",
            id="query-key-and-token-keep-others",
        ),
        pytest.param(
            f"http://api.example.com/v1?apiKey={KEY}&access_token={TOKEN}#frag",
            f"http://api.example.com/v1?apiKey={MASK}&access_token={MASK}#frag",
            id="query-camel-case-and-fragment",
        ),
        pytest.param(
            f"postgresql+psycopg://ledger:{PASSWORD}@db:5432/ledger?sslmode=require",
            "postgresql+psycopg://***@db:5432/ledger?sslmode=require",
            id="database-url",
        ),
        pytest.param(
            f"https://u:{PASSWORD}@h/v1?x-api-key={QUERY_KEY}",
            f"https://***@h/v1?x-api-key={MASK}",
            id="both",
        ),
    ],
)
def test_secrets_in_url_strings_are_masked_and_the_rest_stays_readable(
    url: str, expected: str
) -> None:
    masked = mask_secrets({"provider": {"base_url": url}, "mirrors": [url]})
    assert masked == {"provider": {"base_url": expected}, "mirrors": [expected]}
    for secret in (KEY, PASSWORD, QUERY_KEY, TOKEN):
        assert secret not in repr(masked)


@pytest.mark.parametrize(
    "value",
    [
        "https://api.example.com/v1",
        "https://api.example.com/v1?model=gpt-4o&temperature=0.2",
        "http://localhost:8080/",
        "cinematic 35mm framing",
        "user@example.com",
        "a key=value text, not a URL?token=x",
        "",
    ],
)
def test_strings_without_url_secrets_are_unchanged(value: str) -> None:
    assert mask_secrets({"v": value, "l": [value]}) == {"v": value, "l": [value]}


def test_the_input_is_not_modified() -> None:
    config = {"provider": {"base_url": f"https://u:{KEY}@h/v1"}}
    mask_secrets(config)
    assert config["provider"]["base_url"] == f"https://u:{KEY}@h/v1"


def test_no_url_secret_anywhere_under_home_or_in_the_ledger(
    db_url: str, pipeline_home: Path, tmp_path: Path
) -> None:
    base_url = f"https://bot:{PASSWORD}@llm.example.com/v1?api_key={QUERY_KEY}&token={TOKEN}"
    project_file = pipeline_home / "projects" / "proj1" / "project.yaml"
    project_file.parent.mkdir(parents=True, exist_ok=True)
    project_file.write_text(
        yaml.safe_dump({"style": "ink", "provider": {"kind": "offline", "base_url": base_url}})
    )
    with open_harness(pipeline_home, db_url) as h:
        assert h.run("alpha", "beta", "gamma").success
        snapshot = h.envelope("alpha")["project_config_snapshot"]
        assert snapshot["provider"]["base_url"] == (
            f"https://***@llm.example.com/v1?api_key={MASK}&token={MASK}"
        )
        needles = [s.encode() for s in (PASSWORD, QUERY_KEY, TOKEN)]
        for path in tmp_path.rglob("*"):  # PIPELINE_HOME and, for SQLite, the ledger file
            if path.is_file() and path != project_file:
                payload = path.read_bytes()
                assert not any(n in payload for n in needles), f"secret found in {path}"
        with h.ledger.engine.connect() as conn:
            for table in (step_run, step_transition, provider_call):
                text = repr(conn.execute(sa.select(table)).all())
                assert not any(s in text for s in (PASSWORD, QUERY_KEY, TOKEN)), table.name
