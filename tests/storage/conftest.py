"""Fixtures of the storage suites: every test taking ``storage`` runs on a local directory
and on S3 (a real moto server, ``tests/support/s3_server.py``)."""

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from s3_server import SECRET, S3Server, running_s3_server

from resources.storage import ObjectStorage, Storage, open_storage


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Server]:
    with running_s3_server() as server:
        yield server


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[S3Server], None]:
    """Point the AWS_* environment (and only it) at a test server, our SECRET as the key."""

    def apply(server: S3Server) -> None:
        for name in list(os.environ):
            if name.startswith("AWS_"):
                monkeypatch.delenv(name)
        for name, value in server.env(SECRET).items():
            monkeypatch.setenv(name, value)

    return apply


@pytest.fixture(params=["local", "s3"])
def storage(
    request: pytest.FixtureRequest, tmp_path: Path, aws_env: Callable[[S3Server], None]
) -> Storage:
    if request.param == "local":
        return open_storage(None, home=tmp_path / "home")
    server: S3Server = request.getfixturevalue("s3_server")
    aws_env(server)
    opened = open_storage(f"s3://{server.new_bucket()}/pipeline/home", home=tmp_path)
    assert isinstance(opened, ObjectStorage)
    return opened
