"""pytest fixtures: a real S3 endpoint on loopback (moto's server mode) for storage tests.

`ThreadedMotoServer` speaks the S3 HTTP protocol and enforces conditional puts
(`If-None-Match: *`, `If-Match`; 412 on conflict), so the commit protocol is
tested against the same requests it sends to AWS, from this process and from
subprocesses alike. An in-process `mock_aws` would not reach subprocesses.

Import the fixtures into a test module or conftest: `from s3_server import moto_endpoint, s3_uri`.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

# Fake credentials: moto accepts any; the secret doubles as a leak detector.
FAKE_ACCESS_KEY = "AKIAFAKEFORTESTS0001"
FAKE_SECRET_KEY = "fake-secret-3f9a1c-never-print-me"
_buckets = itertools.count()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """Start moto's S3 server on 127.0.0.1 (free port) and point boto/s3fs at it."""
    from moto.server import ThreadedMotoServer

    saved = {
        k: os.environ.get(k)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ["AWS_ACCESS_KEY_ID"] = FAKE_ACCESS_KEY
    os.environ["AWS_SECRET_ACCESS_KEY"] = FAKE_SECRET_KEY
    os.environ["AWS_DEFAULT_REGION"] = "us-east-1"
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_uri(moto_endpoint: str) -> str:
    """A fresh, empty bucket per test; returns `s3://<bucket>/data`."""
    import boto3

    bucket = f"dspark-test-{os.getpid()}-{next(_buckets)}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket
    )
    return f"s3://{bucket}/data"
