"""pipeline.storage on local disk and on a real S3 endpoint (moto server on loopback)."""

# ruff: noqa: F811  (fixtures imported from s3_server are redefined as arguments)

from __future__ import annotations

import errno
import logging
import os
import threading

import pytest
from botocore.exceptions import ClientError
from s3_server import FAKE_SECRET_KEY, moto_endpoint, s3_uri  # noqa: F401  (fixtures)

from pipeline.storage import (
    AlreadyExists,
    LocalStorage,
    PreconditionFailed,
    RetryPolicy,
    is_transient,
    open_storage,
)
from pipeline.storage.s3 import S3Storage


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        return LocalStorage(tmp_path / "root")
    return S3Storage(
        request.getfixturevalue("s3_uri"), endpoint_url=request.getfixturevalue("moto_endpoint")
    )


def test_put_if_absent_never_overwrites(storage):
    storage.put_if_absent("manifests/v000001.json", b"first")
    with pytest.raises(AlreadyExists, match="v000001.json already exists"):
        storage.put_if_absent("manifests/v000001.json", b"second")
    assert storage.read_bytes("manifests/v000001.json") == b"first"


def test_put_if_absent_race_has_one_winner(storage):
    barrier = threading.Barrier(6)
    won = []

    def put(i: int) -> None:
        barrier.wait()
        try:
            storage.put_if_absent("k", f"writer {i}".encode())
            won.append(i)
        except AlreadyExists:
            pass

    threads = [threading.Thread(target=put, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert storage.read_bytes("k") == f"writer {won[0]}".encode()


def test_compare_and_swap(storage):
    assert storage.read_tagged("_latest") is None
    storage.put_if_match("_latest", b"1", None)  # create
    with pytest.raises(PreconditionFailed):
        storage.put_if_match("_latest", b"x", None)  # exists already
    data, tag = storage.read_tagged("_latest")
    assert data == b"1"
    storage.put_if_match("_latest", b"2", tag)
    with pytest.raises(PreconditionFailed):
        storage.put_if_match("_latest", b"3", tag)  # stale tag
    assert storage.read_tagged("_latest")[0] == b"2"


def test_open_write_is_all_or_nothing(storage):
    with pytest.raises(RuntimeError):
        with storage.open_write("shards/a.parquet") as f:
            f.write(b"x" * 1000)
            raise RuntimeError("writer died")
    assert not storage.exists("shards/a.parquet")
    with storage.open_write("shards/a.parquet") as f:
        f.write(b"y" * 1000)
    assert storage.read_bytes("shards/a.parquet") == b"y" * 1000
    assert [o.key for o in storage.list("shards/")] == ["shards/a.parquet"]
    assert storage.info("shards/a.parquet").size == 1000
    with storage.open_read("shards/a.parquet") as f:
        assert f.read(3) == b"yyy"
    storage.delete("shards/a.parquet")
    assert not storage.exists("shards/a.parquet") and storage.list("shards/") == []


def test_local_list_skips_a_file_renamed_away_while_it_walks(tmp_path, monkeypatch):
    # A writer's temp file is renamed to its final name between the directory
    # walk and the stat (seen in CI: gc listing during a regeneration).
    storage = LocalStorage(tmp_path / "root")
    storage.put_if_absent("index/a.json", b"{}")
    storage.put_if_absent("index/.b.json.tmp-1-2", b"{}")
    walk = os.walk

    def racing_walk(top):
        for dirpath, dirnames, filenames in walk(top):
            if ".b.json.tmp-1-2" in filenames:
                os.unlink(os.path.join(dirpath, ".b.json.tmp-1-2"))
            yield dirpath, dirnames, filenames

    monkeypatch.setattr("pipeline.storage.local.os.walk", racing_walk)
    assert [o.key for o in storage.list()] == ["index/a.json"]


def test_keys_are_checked(storage):
    for bad in ["", "/abs", "a/../b", "a//b"]:
        with pytest.raises(ValueError, match="invalid storage key"):
            storage.url(bad)


def test_open_storage_resolves_uris(tmp_path, monkeypatch, moto_endpoint, s3_uri):
    assert isinstance(open_storage(tmp_path), LocalStorage)
    assert isinstance(open_storage(f"file://{tmp_path}"), LocalStorage)
    with pytest.raises(ValueError, match="unsupported storage URI"):
        open_storage("gs://bucket/x")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)  # as on a cluster
    s3 = open_storage(s3_uri)
    assert isinstance(s3, S3Storage) and s3.endpoint_url == moto_endpoint
    s3.put_if_absent("hello", b"world")
    assert s3.read_bytes("hello") == b"world"


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject"
    )


def test_only_transient_errors_are_retried():
    assert is_transient(_client_error("SlowDown", 503))
    assert is_transient(_client_error("InternalError", 500))
    assert is_transient(TimeoutError())
    assert is_transient(OSError(errno.ECONNRESET, "reset"))
    assert not is_transient(_client_error("PreconditionFailed", 412))
    assert not is_transient(_client_error("AccessDenied", 403))
    assert not is_transient(AlreadyExists("x"))
    assert not is_transient(ValueError("bad"))

    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("slow network")
        return "ok"

    policy = RetryPolicy(num_attempts=4, base_delay_s=0.001)
    assert policy.call("flaky", flaky) == "ok" and len(calls) == 3

    def denied() -> None:
        calls.append(1)
        raise _client_error("AccessDenied", 403)

    calls.clear()
    with pytest.raises(ClientError):
        policy.call("denied", denied)
    assert len(calls) == 1


def test_credentials_never_reach_logs_manifests_or_output(
    s3_uri, moto_endpoint, caplog, monkeypatch
):
    """The secret key is used (moto accepts it), but appears nowhere we write or print."""
    from click.testing import CliRunner
    from shards.helpers import write_unit

    from pipeline.cli import cli
    from pipeline.table.dataset import Dataset
    from pipeline.table.gc import gc_dataset
    from pipeline.table.inspection import inspect_dataset, verify_dataset

    caplog.set_level(logging.DEBUG)  # botocore and s3fs included
    ds = Dataset.open(s3_uri, endpoint_url=moto_endpoint)
    ds.commit([write_unit(ds, "unit-a", 2)[0]])
    texts = [
        f(s3_uri, endpoint_url=moto_endpoint).to_text()
        for f in (inspect_dataset, verify_dataset, gc_dataset)
    ]
    assert "committed version=1" in caplog.text  # the capture works
    assert FAKE_SECRET_KEY not in caplog.text
    # The CLI (it resets logging, so it runs after the log check).
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    outputs = [CliRunner().invoke(cli, [cmd, s3_uri]) for cmd in ("inspect", "verify", "gc")]
    assert all(out.exit_code == 0 for out in outputs)
    stored = b"".join(ds.storage.read_bytes(o.key) for o in ds.storage.list())
    assert FAKE_SECRET_KEY.encode() not in stored
    assert all(FAKE_SECRET_KEY not in text for text in texts + [o.output for o in outputs])
    assert FAKE_SECRET_KEY not in repr(ds) + repr(ds.storage) + str(ds.storage.storage_options())


def test_open_create_never_replaces_an_existing_name(storage):
    with storage.open_create("shards/a.parquet") as f:
        f.write(b"first" * 100)
    with pytest.raises(AlreadyExists, match="never written twice"):
        with storage.open_create("shards/a.parquet") as f:
            f.write(b"other" * 100)  # same size, other bytes: a late zombie writer
    assert storage.read_bytes("shards/a.parquet") == b"first" * 100
    with pytest.raises(RuntimeError):
        with storage.open_create("shards/b.parquet") as f:
            f.write(b"x")
            raise RuntimeError("writer died")
    assert not storage.exists("shards/b.parquet")
    assert [o.key for o in storage.list("shards/")] == ["shards/a.parquet"]
    assert storage.list_uploads() == []


def test_large_create_only_upload_is_multipart_and_conditional(tmp_path, moto_endpoint, s3_uri):
    from pipeline.storage import s3 as s3mod

    storage = S3Storage(s3_uri, endpoint_url=moto_endpoint)
    body = bytes(range(256)) * ((s3mod.PART_BYTES + 1000) // 256)
    with storage.open_create("shards/big.parquet") as f:
        for i in range(0, len(body), 1 << 20):
            f.write(body[i : i + (1 << 20)])
        assert len(storage.list_uploads()) == 1  # in flight: a multipart upload, not an object
        assert not storage.exists("shards/big.parquet")
    assert storage.read_bytes("shards/big.parquet") == body
    with pytest.raises(AlreadyExists):
        with storage.open_create("shards/big.parquet") as f:
            f.write(b"\0" * len(body))
    assert storage.read_bytes("shards/big.parquet") == body
    assert storage.list_uploads() == []  # the loser's upload was aborted
    # An upload left behind by a killed writer is listed, and can be aborted.
    upload = storage.fs.call_s3(
        "create_multipart_upload", Bucket=storage.bucket, Key=storage._key("shards/dead.parquet")
    )
    (left,) = storage.list_uploads("shards/")
    assert left.key == "shards/dead.parquet" and left.upload_id == upload["UploadId"]
    storage.abort_upload(left)
    assert storage.list_uploads() == []
