"""The chaos suite (marker `chaos`, `make chaos`): every test here gets the marker.

Fixtures: the loopback S3 server (moto) of the other suites, and one of its
own that a test can stop and start again on the same port with its objects
kept (moto's state lives in this process), as a restarted MinIO with its
disks would.
"""

# ruff: noqa: F811

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from s3_server import moto_endpoint, s3_uri  # noqa: F401  (fixtures)

HERE = Path(__file__).parent

# The in-process runs use one torch thread: on a small shared machine OpenMP
# spin-waiting made two threads ~40x slower than one (pipeline/demo/reference_shards.py).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.chaos)


class RestartableS3:
    """A moto S3 server on a fixed loopback port that can go down and come back."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self._make = lambda port: ThreadedMotoServer(
            ip_address="127.0.0.1", port=port, verbose=False
        )
        self.server = self._make(0)
        self.server.start()
        self.host, self.port = self.server.get_host_and_port()
        self.endpoint = f"http://{self.host}:{self.port}"
        self.up = True
        self.restarts = 0

    def stop(self) -> None:
        if self.up:
            self.server.stop()
            self.up = False

    def start(self) -> None:
        if not self.up:
            self.server = self._make(self.port)
            self.server.start()
            self.up = True
            self.restarts += 1


@pytest.fixture
def restartable_s3(moto_endpoint) -> Iterator[RestartableS3]:  # moto_endpoint: the fake keys
    import boto3

    server = RestartableS3()
    bucket = f"chaos-{os.getpid()}"
    boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket
    )
    server.uri = f"s3://{bucket}/data"
    try:
        yield server
    finally:
        server.start()
        server.stop()


@pytest.fixture
def short_lease(monkeypatch):
    """A 6 s writer lease (1 s clock margin) instead of 60 s (10 s): a rerun after a dead
    driver waits ~8 s for its lease to expire instead of ~70 s. Same code, shorter clock."""
    from pipeline.table import lease

    monkeypatch.setattr(lease, "DEFAULT_TTL_S", 6.0)
    monkeypatch.setattr(lease, "CLOCK_MARGIN_S", 1.0)
    return lease
