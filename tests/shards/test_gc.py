"""gc and retention: decided from manifests, sessions and pins, never from file age alone."""

from __future__ import annotations

import os
import time

import pytest
import torch

from pipeline.shards.gc import gc_dataset
from pipeline.shards.inspection import verify_dataset
from pipeline.shards.lease import WriteSession
from pipeline.shards.manifest import Dataset
from pipeline.shards.reader import ShardReader
from pipeline.storage.s3 import S3Storage

from .helpers import write_unit


def _history(ds):
    a, sa = write_unit(ds, "unit-a", 2)
    ds.commit([a])  # v1: a
    ds.commit([write_unit(ds, "unit-b", 2)[0]])  # v2: a b
    ds.commit([], remove=[a.path])  # v3: b
    ds.commit([write_unit(ds, "unit-c", 2)[0]])  # v4: b c
    ds.commit([write_unit(ds, "unit-d", 2)[0]])  # v5: b c d
    return a


def test_retention_keeps_the_newest_and_the_pinned_versions(root):
    ds = Dataset.open(root)
    a = _history(ds)
    pinned = {s.sample_id: s.hidden_states for s in ShardReader(root, version=2, pin="run-7")}
    kept = gc_dataset(root, keep_versions=2, min_age_s=0, delete=True)
    assert kept.retained == (2, 4, 5) and kept.expired == (1, 3)
    assert ds.storage.exists(a.path)  # version 2 is pinned and names it
    for s in ShardReader(root, version=2):
        assert s.hidden_states.view(torch.int16).equal(pinned[s.sample_id].view(torch.int16))
    ds.unpin("run-7")
    report = gc_dataset(root, keep_versions=2, min_age_s=0, delete=True)
    assert report.expired == (2,)
    sidecar = a.path.replace("shards/", "index/").replace(".parquet", ".json")
    assert not ds.storage.exists(a.path) and not ds.storage.exists(sidecar)
    assert Dataset.open(root).versions() == [4, 5]
    assert verify_dataset(root, version=4).ok and verify_dataset(root).ok
    assert gc_dataset(root, keep_versions=2, min_age_s=0).garbage == ()


def test_a_live_session_protects_its_files_whatever_their_age(tmp_path):
    root = str(tmp_path / "ds")
    ds = Dataset.open(root)
    ds.commit([write_unit(ds, "unit-a", 1)[0]])
    dead, _ = write_unit(ds, "unit-dead", 1)  # a crashed run's file, from before the session
    past = time.time() - 3 * 3600
    os.utime(ds.storage.url(dead.path), (past, past))
    with WriteSession(ds, owner="long regeneration"):
        waiting, _ = write_unit(ds, "unit-waiting", 1)  # finished, waiting for its batch commit
        report = gc_dataset(root, min_age_s=0, delete=True)
        assert [o.key for o in report.garbage] == [dead.path]
        assert [o.key for o in report.in_flight] == [waiting.path]
        assert ds.storage.exists(waiting.path) and not ds.storage.exists(dead.path)
        ds.commit([waiting])
    assert gc_dataset(root, min_age_s=0).garbage == ()


def test_stale_multipart_uploads_are_aborted_live_ones_kept(s3_uri, moto_endpoint):
    storage = S3Storage(s3_uri, endpoint_url=moto_endpoint)
    ds = Dataset(storage)
    ds.commit([write_unit(ds, "unit-a", 1)[0]])

    def start_upload(name):
        storage.fs.call_s3(
            "create_multipart_upload", Bucket=storage.bucket, Key=storage._key(f"shards/{name}")
        )

    start_upload("stale.parquet")
    report = gc_dataset(s3_uri, endpoint_url=moto_endpoint, min_age_s=0, delete=True)
    assert [u.key for u in report.stale_uploads] == ["shards/stale.parquet"]
    assert storage.list_uploads() == []
    with WriteSession(ds, owner="writer"):
        start_upload("live.parquet")  # an hour-long shard upload of a live run
        report = gc_dataset(s3_uri, endpoint_url=moto_endpoint, min_age_s=0, delete=True)
        assert report.stale_uploads == () and len(storage.list_uploads()) == 1


def test_gc_keeps_a_segment_that_a_retried_commit_reuses_while_gc_runs(root, monkeypatch):
    """gc lists and decides; a commit retried hours later reuses the segment (and sidecar)
    its failed first attempt left; then gc deletes what it decided was garbage."""
    import pipeline.shards.gc as gc_module
    from pipeline.shards.lease import LeaseLost

    ds = Dataset.open(root)
    ds.commit([write_unit(ds, "unit-a", 2)[0]])  # v1
    info, samples = write_unit(ds, "unit-b", 3)

    def lost():
        raise LeaseLost("injected: the first attempt stops at its fence")

    with pytest.raises(LeaseLost):
        ds.commit([info], parent_version=1, fence=lost)  # leaves a sidecar and a segment
    left = {o.key for o in ds.storage.list("manifests/segments/")}
    assert left and ds.latest_version() == 1
    real, retried = gc_module._referenced, []

    def referenced_then_the_retry_commits(*args, **kwargs):
        out = real(*args, **kwargs)  # gc has decided what is referenced...
        if not retried:  # ...the retry reuses the files
            retried.append(Dataset.open(root).commit([info], parent_version=1))
        return out

    monkeypatch.setattr(gc_module, "_referenced", referenced_then_the_retry_commits)
    gc_dataset(root, delete=True, min_age_s=0, now=time.time() + 7200)  # "hours later"
    fresh = Dataset.open(root)
    assert fresh.latest_version() == 2
    got = {s.sample_id for s in ShardReader(root, prefetch=0)}
    assert {s.sample_id for s in samples} <= got
    assert verify_dataset(root).ok


def test_a_reused_segment_deleted_before_the_commit_point_is_put_back(root):
    """The other order: gc read the versions before the retry's root landed, and deletes
    the reused segment just before the commit point; the commit puts it back."""
    from pipeline.shards.lease import LeaseLost

    ds = Dataset.open(root)
    ds.commit([write_unit(ds, "unit-a", 2)[0]])
    info, samples = write_unit(ds, "unit-b", 3)
    before = {o.key for o in ds.storage.list()}

    def lost():
        raise LeaseLost("injected: the first attempt stops at its fence")

    with pytest.raises(LeaseLost):
        ds.commit([info], parent_version=1, fence=lost)
    left = sorted({o.key for o in ds.storage.list()} - before)  # its segment and sidecar
    assert any(k.startswith("manifests/segments/") for k in left)

    def gc_deletes():
        for key in left:
            ds.storage.delete(key)

    Dataset.open(root).commit([info], parent_version=1, fence=gc_deletes)
    assert all(ds.storage.exists(key) for key in left), [(k, ds.storage.exists(k)) for k in left]
    assert {s.sample_id for s in samples} <= {s.sample_id for s in ShardReader(root, prefetch=0)}
