"""The commit lifecycle every shard producer uses: resume listing, batches, races, failures."""

from __future__ import annotations

import pytest
from shards.helpers import provenance, write_unit

from pipeline.table.dataset import Dataset
from pipeline.table.sink import DatasetSink


def _sink(dataset, every_units=2, every_seconds=3600.0):
    return DatasetSink(
        dataset,
        provenance(),
        commit_every_units=every_units,
        commit_every_seconds=every_seconds,
    )


def test_batches_become_versions_and_a_rerun_sees_the_units(root):
    ds = Dataset.open(root)
    sink = _sink(ds)
    assert sink.on_write_start() == set() and sink.version is None
    for i in range(5):
        info, _ = write_unit(ds, f"u{i}", 2)
        sink.on_unit_written(info)
    assert sink.version == 2  # after units 2 and 4; unit 5 still queued
    assert sink.on_write_complete() == 3
    assert [len(ds.manifest(v).shards) for v in (1, 2, 3)] == [2, 4, 5]
    again = _sink(ds)
    assert again.on_write_start() == {f"u{i}" for i in range(5)}
    assert again.on_write_complete() == 3  # nothing queued: nothing committed


def test_a_commit_that_raced_another_writer_is_redone_on_top_of_it(root):
    ds = Dataset.open(root)
    sink = _sink(ds, every_units=1)
    sink.on_write_start()
    theirs, _ = write_unit(ds, "theirs", 1)
    ds.commit([theirs])  # another driver publishes version 1 meanwhile
    ours, _ = write_unit(ds, "ours", 1)
    sink.on_unit_written(ours)
    assert sink.version == 2
    assert {s.unit_id for s in ds.manifest(2).shards} == {"theirs", "ours"}


def test_a_failed_run_still_publishes_the_units_that_finished(root):
    ds = Dataset.open(root)
    sink = _sink(ds, every_units=10)
    sink.on_write_start()
    info, _ = write_unit(ds, "finished", 2)
    sink.on_unit_written(info)
    assert ds.latest_version() is None
    assert sink.on_write_failed(RuntimeError("replica lost")) == 1
    assert ds.committed_units() == {"finished"}


def test_a_batch_is_also_published_when_it_is_old_enough(tmp_path):
    ds = Dataset.open(tmp_path / "ds")
    sink = _sink(ds, every_units=100, every_seconds=1e-9)
    sink.on_write_start()
    info, _ = write_unit(ds, "u0", 1)
    sink.on_unit_written(info)
    assert sink.version == 1


def test_bad_batch_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="positive"):
        DatasetSink(Dataset.open(tmp_path), provenance(), commit_every_units=0)
