"""Fixtures for the table tests: the loopback S3 server and a dataset root per backend."""

from __future__ import annotations

import pytest
from s3_server import moto_endpoint, s3_uri  # noqa: F401  (fixtures)


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path, monkeypatch) -> str:
    """A fresh dataset root, once on local disk and once on the loopback S3 server.

    For S3 the endpoint travels as AWS_ENDPOINT_URL (as on a cluster), so
    subprocesses started by a test reach the same server.
    """
    if request.param == "local":
        return str(tmp_path / "dataset")
    monkeypatch.setenv("AWS_ENDPOINT_URL", request.getfixturevalue("moto_endpoint"))
    return request.getfixturevalue("s3_uri")
