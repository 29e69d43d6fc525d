"""An S3 endpoint for tests: moto's threaded server on 127.0.0.1 (no network, no account).

``running_s3_server()`` starts one on a port the OS picks and stops it afterwards; each test
takes a fresh bucket (``new_bucket``) and the environment a bucket storage is configured
from (``env``), credentials included, so tests never touch a real account. When the server
cannot start the tests are skipped, or failed when ``CI`` is set or
``PIPELINE_REQUIRE_S3=1`` (set by ``.ci/run``): CI never silently skips the S3 half of the
storage contract.
"""

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

ACCESS_KEY_ID = "AKIASTORAGETESTS0000"
# A recognisable credential: it must appear in no message, detail or display URL. Fixed, not
# random: it appears in parametrized test ids, which every xdist worker must compute alike.
SECRET = "SeCrEt-4f1c9b7e2a6d48c0b35e9d71a8f2c6e4"
REGION = "us-east-1"


def require_s3() -> bool:
    """True when an S3 endpoint that cannot start must fail the tests, not skip them."""
    return bool(os.environ.get("CI")) or os.environ.get("PIPELINE_REQUIRE_S3", "") not in (
        "",
        "0",
        "false",
    )


@dataclass(frozen=True)
class S3Server:
    """A running moto server: its endpoint, and what a storage over it needs."""

    endpoint: str

    def client(self, secret: str = "test-secret") -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY_ID,
            aws_secret_access_key=secret,
            region_name=REGION,
        )

    def new_bucket(self) -> str:
        """A new, empty bucket with a name no other test uses."""
        name = f"t-{uuid.uuid4().hex[:24]}"
        self.client().create_bucket(Bucket=name)
        return name

    def env(self, secret: str) -> dict[str, str]:
        """The variables obstore configures an S3 client from (the only source we use)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }


@contextmanager
def running_s3_server() -> Iterator[S3Server]:
    """A moto server for the duration of the block (skip or fail if it cannot start)."""
    server = None
    try:
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        running = S3Server(f"http://{host}:{port}")
        running.client().list_buckets()  # it answers, not just listens
    except Exception as exc:
        if server is not None:
            server.stop()
        message = f"S3 tests cannot run: moto's server did not start: {type(exc).__name__}: {exc}"
        if require_s3():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield running
    finally:
        server.stop()
