"""The commit against failures after its checks: the pointer put, a pause before the root."""

from __future__ import annotations

import errno
import time

import pytest
from shards.helpers import assert_exactly_once, provenance, write_unit

from pipeline.table import retention
from pipeline.table.dataset import Dataset
from pipeline.table.gc import gc_dataset
from pipeline.table.layout import LATEST_KEY, manifest_key
from pipeline.table.publish import StaleCommit
from pipeline.table.sink import DatasetSink


class _PointerDown:
    """A store whose `_latest` puts fail as S3 answers past every retry (500 InternalError)."""

    def __init__(self, storage) -> None:
        self._storage, self.down = storage, True

    def __getattr__(self, name):
        return getattr(self._storage, name)

    def put_if_match(self, key, data, tag):
        if key == LATEST_KEY and self.down:
            raise OSError(errno.EIO, "injected: InternalError (put_object _latest), 5 tries")
        return self._storage.put_if_match(key, data, tag)


def test_pointer_put_errors_leave_one_truth(root):
    """The version is the truth: the commit succeeds, its cleanup publishes no empty version,
    readers find it past the pointer, and gc --keep-versions 1 retires nothing they need."""
    ds = Dataset.open(root)
    first, committed = write_unit(ds, "unit-a", 2)
    ds.commit([first])  # v1, pointer at 1
    store = _PointerDown(Dataset.open(root).storage)
    broken = Dataset(store)
    sink = DatasetSink(broken, provenance(), commit_every_units=1)
    sink.on_write_start()
    info, samples = write_unit(broken, "unit-b", 3)
    sink.on_unit_written(info)  # commits v2; the pointer put fails
    assert sink.version == 2
    assert broken.commit([info]).version == 2  # a retry of it changes nothing: no version 3
    sink.on_write_failed(RuntimeError("injected: the run stops"))  # its cleanup commits nothing
    fresh = Dataset.open(root)
    assert fresh.pointer_version() == 1 and fresh.latest_version() == 2
    assert not fresh.storage.exists(manifest_key(3))
    committed += samples
    assert_exactly_once(root, committed)
    gc = gc_dataset(root, keep_versions=1, min_age_s=0, unsafe_min_age=True, delete=True)
    assert fresh.pointer_version() == 2 and gc.expired == ()  # it decided before moving it
    assert_exactly_once(root, committed)
    store.down = False
    info, samples = write_unit(fresh, "unit-c", 2)
    assert Dataset.open(root).commit([info]).version == 3
    gc_dataset(root, keep_versions=1, min_age_s=0, unsafe_min_age=True, delete=True)
    assert_exactly_once(root, committed + samples)


def test_gc_with_the_pointer_down_retires_nothing_past_it(root, monkeypatch):
    """With gc's own pointer puts failing too, what `_latest` names and everything newer stays."""
    ds = Dataset.open(root)
    committed = []
    for unit in ("unit-a", "unit-b", "unit-c"):
        info, samples = write_unit(ds, unit, 2)
        ds.commit([info])
        committed += samples
    store = _PointerDown(ds.storage)
    ds.storage.put_if_match(LATEST_KEY, b'{"version": 1}', ds.storage.read_tagged(LATEST_KEY)[1])
    with monkeypatch.context() as patch:  # gc opens the dataset through the broken store
        patch.setattr(Dataset, "open", classmethod(lambda cls, uri, **kw: cls(store)))
        report = gc_dataset(root, keep_versions=1, min_age_s=0, unsafe_min_age=True, delete=True)
    assert report.expired == () and report.retained == (1, 2, 3)
    assert_exactly_once(root, committed)


def test_a_writer_paused_before_its_root_put_reports_no_lost_sample(root, monkeypatch):
    """Nobody takes over: the writer passes every check, pauses past gc's minimum age while
    gc deletes its files, then its root lands. The commit sees it landed late, finds a
    file gone, publishes a copy of its parent over it, and raises."""
    monkeypatch.setattr(retention, "MAX_COMMIT_AGE_S", 2.0)
    monkeypatch.setattr(retention, "GC_REREAD_S", 0.2)
    min_age_s = 4.0
    ds = Dataset.open(root)
    first, committed = write_unit(ds, "unit-a", 2)
    ds.commit([first])
    info, _ = write_unit(ds, "unit-b", 3)
    real_put = ds.storage.put_if_absent

    def pause_at_the_root_put(key, data):
        if key == manifest_key(2):
            time.sleep(min_age_s + 1.5)  # a stop-the-world pause...
            report = gc_dataset(root, min_age_s=min_age_s, unsafe_min_age=True, delete=True)
            assert info.path in {o.key for o in report.garbage}  # ...while gc deletes
        return real_put(key, data)

    monkeypatch.setattr(ds.storage, "put_if_absent", pause_at_the_root_put)
    with pytest.raises(StaleCommit, match="version 3 restores version 1"):
        ds.commit([info])
    fresh = Dataset.open(root)
    assert fresh.latest_version() == 3 and fresh.manifest(3).commit["reverts"] == 2
    assert_exactly_once(root, committed)
    more, samples = write_unit(fresh, "unit-c", 2)
    assert fresh.commit([more]).version == 4
    assert_exactly_once(root, committed + samples)
