"""Fixtures of the storage suites: every test taking ``storage`` runs on a local directory,
on S3 (a real moto server, ``tests/support/s3_server.py``), on Azure Blob (the azurite
emulator, ``tests/support/azurite_server.py``) and on ``MemoryStorage``
(``resources/testing.py``), the in-memory fake the fast tests use: the same suite
proves it keeps the contract. The server fixtures are the root conftest's."""

from collections.abc import Callable
from pathlib import Path

import pytest
from azurite_server import AzureServer
from s3_server import S3Server

from resources.storage import ObjectStorage, Storage, open_storage
from resources.testing import MemoryStorage


@pytest.fixture(params=["local", "s3", "azure", "memory"])
def storage(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    aws_env: Callable[[S3Server], None],
    azure_env: Callable[[AzureServer], None],
) -> Storage:
    if request.param == "local":
        return open_storage(None, home=tmp_path / "home")
    if request.param == "memory":
        return MemoryStorage(tmp_path.name)
    if request.param == "azure":
        azure: AzureServer = request.getfixturevalue("azure_server")
        azure_env(azure)
        opened = open_storage(f"az://{azure.new_container()}/pipeline/home", home=tmp_path)
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        aws_env(server)
        opened = open_storage(f"s3://{server.new_bucket()}/pipeline/home", home=tmp_path)
    assert isinstance(opened, ObjectStorage)
    return opened
