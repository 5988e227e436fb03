"""gc and retention: decided from manifests, sessions and pins, never from file age alone."""

from __future__ import annotations

import os
import time

import pytest
import torch
from shards.helpers import assert_exactly_once, write_unit

import pipeline.table.gc as gc_module
from pipeline.storage.s3 import S3Storage
from pipeline.table import retention
from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.gc import gc_dataset
from pipeline.table.inspection import verify_dataset
from pipeline.table.layout import LATEST_KEY, pointer_json
from pipeline.table.lease import LeaseLost, WriteSession
from pipeline.table.publish import StaleCommit
from pipeline.table.reader import ShardReader


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
    kept = gc_dataset(root, keep_versions=2, min_age_s=0, unsafe_min_age=True, delete=True)
    assert kept.retained == (2, 4, 5) and kept.expired == (1, 3)
    assert ds.storage.exists(a.path)  # version 2 is pinned and names it
    for s in ShardReader(root, version=2):
        assert s.hidden_states.view(torch.int16).equal(pinned[s.sample_id].view(torch.int16))
    ds.unpin("run-7")
    report = gc_dataset(root, keep_versions=2, min_age_s=0, unsafe_min_age=True, delete=True)
    assert report.expired == (2,)
    sidecar = a.path.replace("shards/", "index/").replace(".parquet", ".json")
    assert not ds.storage.exists(a.path) and not ds.storage.exists(sidecar)
    # Retired, not deleted: the roots stay, so no number is ever reused.
    assert Dataset.open(root).versions() == [1, 2, 3, 4, 5]
    assert Dataset.open(root).retired_versions() == {1, 2, 3}
    with pytest.raises(DatasetError, match="version 2 was retired by gc"):
        Dataset.open(root).manifest(2)
    assert verify_dataset(root, version=4).ok and verify_dataset(root).ok
    assert gc_dataset(root, keep_versions=2, min_age_s=0, unsafe_min_age=True).garbage == ()


def test_a_live_session_protects_its_files_whatever_their_age(tmp_path):
    root = str(tmp_path / "ds")
    ds = Dataset.open(root)
    ds.commit([write_unit(ds, "unit-a", 1)[0]])
    dead, _ = write_unit(ds, "unit-dead", 1)  # a crashed run's file, from before the session
    past = time.time() - 3 * 3600
    os.utime(ds.storage.url(dead.path), (past, past))
    with WriteSession(ds, owner="long regeneration"):
        waiting, _ = write_unit(ds, "unit-waiting", 1)  # finished, waiting for its batch commit
        report = gc_dataset(root, min_age_s=0, unsafe_min_age=True, delete=True)
        assert [o.key for o in report.garbage] == [dead.path]
        assert [o.key for o in report.in_flight] == [waiting.path]
        assert ds.storage.exists(waiting.path) and not ds.storage.exists(dead.path)
        ds.commit([waiting])
    assert gc_dataset(root, min_age_s=0, unsafe_min_age=True).garbage == ()


def test_stale_multipart_uploads_are_aborted_live_ones_kept(s3_uri, moto_endpoint):
    storage = S3Storage(s3_uri, endpoint_url=moto_endpoint)
    ds = Dataset(storage)
    ds.commit([write_unit(ds, "unit-a", 1)[0]])

    def start_upload(name):
        storage.fs.call_s3(
            "create_multipart_upload", Bucket=storage.bucket, Key=storage._key(f"shards/{name}")
        )

    start_upload("stale.parquet")
    report = gc_dataset(
        s3_uri, endpoint_url=moto_endpoint, min_age_s=0, unsafe_min_age=True, delete=True
    )
    assert [u.key for u in report.stale_uploads] == ["shards/stale.parquet"]
    assert storage.list_uploads() == []
    with WriteSession(ds, owner="writer"):
        start_upload("live.parquet")  # an hour-long shard upload of a live run
        report = gc_dataset(
            s3_uri, endpoint_url=moto_endpoint, min_age_s=0, unsafe_min_age=True, delete=True
        )
        assert report.stale_uploads == () and len(storage.list_uploads()) == 1


def _lost():
    raise LeaseLost("injected: the first attempt stops at its fence")


@pytest.mark.parametrize("late", [False, True], ids=["retry in time", "retry after the bound"])
def test_gc_against_a_retried_commit_loses_no_committed_sample(root, monkeypatch, late):
    """The interleaving: a commit whose first attempt timed out (leaving its sidecar and
    segment) is retried and lands between gc's last read of the versions and its deletes.
    In time, its files are too young for gc; after the bound, the commit refuses to land."""
    monkeypatch.setattr(retention, "MAX_COMMIT_AGE_S", 2.0)
    min_age_s = 4.0  # above the commit bound, as retention.py requires
    ds = Dataset.open(root)
    first, committed = write_unit(ds, "unit-a", 2)
    ds.commit([first])  # v1
    info, samples = write_unit(ds, "unit-b", 3)
    with pytest.raises(LeaseLost):
        ds.commit([info], parent_version=1, fence=_lost)  # leaves a sidecar and a segment
    if late:
        time.sleep(min_age_s + 1.5)  # old enough for gc on the store's clock
    real, outcome = gc_module._delete, []

    def retry_lands_then_gc_deletes(*args, **kwargs):
        try:
            outcome.append(Dataset.open(root).commit([info], parent_version=1))
        except StaleCommit as err:
            outcome.append(err)
        return real(*args, **kwargs)

    monkeypatch.setattr(gc_module, "_delete", retry_lands_then_gc_deletes)
    report = gc_dataset(root, delete=True, min_age_s=min_age_s, unsafe_min_age=True)
    if late:  # refused before its commit point: nothing published, gc deleted the leftovers
        assert isinstance(outcome[0], StaleCommit), outcome
        assert "published nothing" in str(outcome[0])
        assert info.path in {o.key for o in report.garbage}
        assert Dataset.open(root).latest_version() == 1
        redo, samples = write_unit(ds, "unit-b", 3)  # the unit is redone and commits
        Dataset.open(root).commit([redo])
    else:  # landed: its files were too young to be garbage
        assert outcome[0].version == 2 and info.path in {o.key for o in report.young}
    assert_exactly_once(root, committed + samples)


def test_a_lagging_pointer_and_keep_versions_1_break_nothing(root):
    """`_latest` three versions behind (its puts failed), then gc --keep-versions 1: gc moves
    the pointer first and never retires what it names; readers and writers go on."""
    ds = Dataset.open(root)
    committed = []
    for unit in ("unit-a", "unit-b", "unit-c", "unit-d"):
        info, samples = write_unit(ds, unit, 2)
        ds.commit([info])
        committed += samples
    tag = ds.storage.read_tagged(LATEST_KEY)[1]
    ds.storage.put_if_match(LATEST_KEY, pointer_json(1), tag)
    dry = gc_dataset(root, keep_versions=1, min_age_s=0, unsafe_min_age=True)
    assert dry.retained == (1, 2, 3, 4)  # the pointer's version and everything newer
    report = gc_dataset(root, keep_versions=1, min_age_s=0, unsafe_min_age=True, delete=True)
    assert Dataset.open(root).pointer_version() == 4 and report.retained == (1, 2, 3, 4)
    report = gc_dataset(root, keep_versions=1, min_age_s=0, unsafe_min_age=True, delete=True)
    assert report.expired == (1, 2, 3) and Dataset.open(root).latest_version() == 4
    assert_exactly_once(root, committed)
    info, samples = write_unit(ds, "unit-e", 2)
    assert Dataset.open(root).commit([info]).version == 5
    assert_exactly_once(root, committed + samples)


def test_a_reused_segment_deleted_before_the_commit_point_is_put_back(root):
    """The other order: gc read the versions before the retry's root landed, and deletes
    the reused segment just before the commit point; the commit puts it back."""
    from pipeline.table.lease import LeaseLost

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
