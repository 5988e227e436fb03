"""Streaming S3 reads and writes under injected transient faults (loopback moto server).

Faults go in beneath S3Storage's retry policy (tests/faults.py): resets,
timeouts and 5xx, half of the failed writes after the request landed, half of
the failed reads after part of the body arrived.
"""

# ruff: noqa: F811  (fixtures imported from s3_server are redefined as arguments)

from __future__ import annotations

import io
import random

import boto3
import pytest
from faults import Faults, FaultyFS
from s3_server import moto_endpoint, s3_uri  # noqa: F401  (fixtures)

from pipeline.storage import AlreadyExists, RetryPolicy, StorageError
from pipeline.storage import s3 as s3mod
from pipeline.storage.s3 import S3Storage

FAST = RetryPolicy(num_attempts=5, base_delay_s=0.001, max_delay_s=0.01)


def _storage(s3_uri, moto_endpoint, faults: Faults | None = None) -> S3Storage:
    storage = S3Storage(s3_uri, endpoint_url=moto_endpoint, retry=FAST)
    if faults is not None:
        storage.fs = FaultyFS(storage.fs, faults)
    return storage


def _body(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def test_a_read_resumes_at_its_offset_after_resets(s3_uri, moto_endpoint):
    body = _body(3 << 20)
    _storage(s3_uri, moto_endpoint).put_if_absent("shards/a.bin", body)
    faults = Faults(rate=0.3, seed=1, ops={"read", "open"})
    storage = _storage(s3_uri, moto_endpoint, faults)
    got = bytearray()
    with storage.open_read("shards/a.bin") as f:
        assert f.seek(0, io.SEEK_END) == len(body) and f.seek(0) == 0
        sizes = [1, 7, 4096, 100_000, 1 << 20]
        i = 0
        while chunk := f.read(sizes[i % len(sizes)]):
            got += chunk
            i += 1
        f.seek(12345)
        buf = bytearray(1000)
        assert f.readinto(buf) == 1000 and bytes(buf) == body[12345:13345]
        assert f.tell() == 13345
    assert bytes(got) == body
    assert faults.injected["read:before"] >= 3  # resets in the middle of reads happened
    assert faults.calls["open"] > faults.injected["read:before"]  # each one reopened


def test_a_read_stops_if_the_object_changed_under_it(s3_uri, moto_endpoint):
    storage = _storage(s3_uri, moto_endpoint)
    with storage.open_write("card.md") as f:
        f.write(b"a" * 1000)
    faults = Faults(rate=1.0, max_in_a_row=1, ops={"read"})
    faults.enabled = False
    flaky = _storage(s3_uri, moto_endpoint, faults)
    f = flaky.open_read("card.md")
    assert f.read(10) == b"a" * 10
    with storage.open_write("card.md") as g:
        g.write(b"b" * 1000)
    faults.enabled = True  # the next read fails once and reopens: another ETag
    with pytest.raises(StorageError, match="changed while it was read"):
        f.read(10)


def test_a_missing_object_raises_at_open(s3_uri, moto_endpoint):
    with pytest.raises(FileNotFoundError):
        _storage(s3_uri, moto_endpoint).open_read("shards/none.bin")


@pytest.mark.parametrize("create_only", [True, False])
def test_multipart_upload_retries_each_part_and_knows_its_own_complete(
    s3_uri, moto_endpoint, create_only
):
    body = _body(2 * s3mod.PART_BYTES + 12345, seed=3)
    faults = Faults(
        rate=0.5, seed=2, ops={"upload_part", "complete_multipart_upload", "put_object"}
    )
    storage = _storage(s3_uri, moto_endpoint, faults)
    key = "shards/big.parquet" if create_only else "errors/big.jsonl"
    opener = storage.open_create if create_only else storage.open_write
    with opener(key) as f:
        for i in range(0, len(body), 3 << 20):
            f.write(body[i : i + (3 << 20)])
    clean = _storage(s3_uri, moto_endpoint)
    assert clean.read_bytes(key) == body
    assert faults.injected["upload_part:before"] + faults.injected["upload_part:after"] >= 1
    assert clean.list_uploads() == []  # the one upload was completed, nothing left open
    if create_only:
        with pytest.raises(AlreadyExists):  # a real second writer is still refused
            with clean.open_create(key) as f:
                f.write(b"x")


def test_a_complete_whose_answer_was_lost_is_ours_not_a_conflict(s3_uri, moto_endpoint):
    body = _body(s3mod.PART_BYTES + 5000, seed=4)
    faults = Faults(rate=1.0, max_in_a_row=1, ops={"complete_multipart_upload", "put_object"})
    faults._rng.random = lambda: 0.0  # every fault is "after": the request landed  # type: ignore[method-assign]
    storage = _storage(s3_uri, moto_endpoint, faults)
    with storage.open_create("shards/c.parquet") as f:
        f.write(body)
    with storage.open_create("shards/small.parquet") as f:
        f.write(b"small")
    assert faults.injected == {"complete_multipart_upload:after": 1, "put_object:after": 1}
    clean = _storage(s3_uri, moto_endpoint)
    assert clean.read_bytes("shards/c.parquet") == body
    assert clean.read_bytes("shards/small.parquet") == b"small"


def test_a_second_writers_object_is_still_a_conflict_after_a_lost_answer(s3_uri, moto_endpoint):
    """The ETag check tells our landed complete from another writer's object of the same name."""
    storage = _storage(s3_uri, moto_endpoint)
    other = _body(s3mod.PART_BYTES + 10, seed=5)
    mine = _body(s3mod.PART_BYTES + 10, seed=6)
    with pytest.raises(AlreadyExists):
        with storage.open_create("shards/d.parquet") as f:
            f.write(mine)
            with storage.open_create("shards/d.parquet") as g:  # wins the name first
                g.write(other)
    assert storage.read_bytes("shards/d.parquet") == other
    assert storage.list_uploads() == []


def test_aborting_an_upload_twice_is_not_an_error(s3_uri, moto_endpoint):
    storage = _storage(s3_uri, moto_endpoint)
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_multipart_upload(
        Bucket=storage.bucket, Key=storage._key("shards/dead.parquet")
    )
    (upload,) = storage.list_uploads()
    storage.abort_upload(upload)
    storage.abort_upload(upload)  # a retried abort whose first try landed
    assert storage.list_uploads() == []
