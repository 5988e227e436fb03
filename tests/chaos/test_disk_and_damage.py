"""The disk fills up mid-run; a byte flips in a committed shard; a manifest is truncated.

Each ends with every sample exactly once and `verify` clean, or with a clear
error that names the damage while every committed version stays readable.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from faults import FullDisk

from pipeline.regenerate.run import run_local
from pipeline.storage import LocalStorage
from pipeline.table.dataset import Dataset
from pipeline.table.errors import DatasetError
from pipeline.table.inspection import verify_dataset
from pipeline.table.layout import manifest_key
from pipeline.table.reader import ShardReader

from .common import Timer, exactly_once, expected_ids, publish, run_config


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A finished regeneration on local disk (24 conversations, several versions), built once."""
    root = tmp_path_factory.mktemp("chaos-base") / "dataset"
    config = run_config(str(root))
    run_local(config)
    return root


@pytest.fixture
def dataset(committed, tmp_path) -> str:
    """A private copy of the finished dataset."""
    root = tmp_path / "dataset"
    shutil.copytree(committed, root)
    return str(root)


def _ids(uri: str, **kwargs) -> list[str]:
    return [s.sample_id for s in ShardReader(uri, prefetch=0, **kwargs)]


def test_a_full_disk_stops_the_run_and_nothing_committed_is_lost(dataset, monkeypatch, short_lease):
    """ENOSPC from a storage wrapper (a tmpfs or loop device needs mount privileges; the
    wrapper fails at an exact byte, the same every run): the run stops naming it."""
    import pipeline.table.dataset as manifest_mod

    timer = Timer()
    before = set(_ids(dataset))
    # The first 24 are committed. The full disk wraps this process's storage, so the shards
    # are written here too (the write-back's threads mode).
    grown = run_config(dataset, num_conversations=48, num_buckets=6, writeback={"mode": "threads"})
    expected = expected_ids(grown)
    disk = FullDisk(LocalStorage(dataset), free_bytes=60_000)
    real = manifest_mod.open_storage
    monkeypatch.setattr(
        manifest_mod,
        "open_storage",
        lambda uri, **kw: disk if str(uri) == dataset else real(uri, **kw),
    )
    with pytest.raises(OSError) as failure:
        run_local(grown)
    assert failure.value.errno == errno.ENOSPC and "No space left" in str(failure.value)
    monkeypatch.setattr(manifest_mod, "open_storage", real)  # space freed
    after = _ids(dataset)
    assert len(after) == len(set(after)) and before <= set(after)  # nothing committed lost
    assert verify_dataset(dataset).ok
    # The rerun waits out the lease the failed run could not release, and finishes.
    run_local(grown, lease_wait_s=short_lease.DEFAULT_TTL_S + 4 * short_lease.CLOCK_MARGIN_S)
    outcome = exactly_once(dataset, expected)
    publish(
        "disk_full",
        "the dataset's disk full (ENOSPC) part-way through a run",
        outcome,
        rows=len(expected),
        faults=disk.refusals,
        seconds=timer.seconds,
        result=f"clear error (OSError ENOSPC), {len(set(after))} committed samples kept; rerun completed",
    )


def test_a_flipped_byte_in_a_shard_is_named_and_the_shard_can_be_redone(dataset):
    timer = Timer()
    config = run_config(dataset)
    expected = expected_ids(config)
    ds = Dataset.open(dataset)
    entry = max(ds.manifest().shards, key=lambda e: e.bytes)
    path = Path(ds.shard_url(entry))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))

    report = verify_dataset(dataset)
    (bad,) = report.corrupt
    assert not report.ok and bad.path == str(path) and "sha256" in bad.problems[0]
    from pipeline.cli import cli

    out = CliRunner().invoke(cli, ["verify", dataset])
    assert out.exit_code == 1 and "CORRUPT" in out.output and entry.path in out.output
    with pytest.raises(DatasetError, match="sha256 .* the file is corrupt"):
        list(ShardReader(dataset, verify=True, prefetch=0))
    # Readers that do not re-hash still never yield a changed tensor: page CRCs.
    with pytest.raises(DatasetError, match=f"{entry.path}, row group .*damaged"):
        list(ShardReader(dataset, prefetch=0))
    # Repair: a version without the damaged shard, then a rerun regenerates its samples.
    ds.commit([], remove=[entry.path])
    run_local(config)
    outcome = exactly_once(dataset, expected)
    publish(
        "flipped_byte",
        "one bit flipped in the middle of a committed shard",
        outcome,
        rows=len(expected),
        faults=1,
        seconds=timer.seconds,
        result="verify names the shard (exit 1); readers refuse it (sha256 or page CRC); removed and regenerated",
    )


def test_a_truncated_manifest_is_named_and_older_versions_still_read(dataset):
    timer = Timer()
    config = run_config(dataset)
    expected = expected_ids(config)
    ds = Dataset.open(dataset)
    newest = ds.latest_version()
    older_ids = _ids(dataset, version=newest - 1)
    root = Path(ds.storage.url(manifest_key(newest)))
    root.write_bytes(root.read_bytes()[: root.stat().st_size // 2])

    fresh = Dataset.open(dataset)
    with pytest.raises(DatasetError, match=f"v{newest:06d}.json: manifest is not valid JSON"):
        fresh.manifest()
    with pytest.raises(DatasetError, match="not valid JSON"):
        verify_dataset(dataset)
    assert _ids(dataset, version=newest - 1) == older_ids  # committed versions still read
    assert verify_dataset(dataset, version=newest - 1).ok
    grown = run_config(dataset, num_conversations=36)
    names = sorted(o.key for o in ds.storage.list())
    with pytest.raises(DatasetError, match="not valid JSON"):
        run_local(grown)  # the run stops before any work, naming the file
    assert sorted(o.key for o in ds.storage.list() if not o.key.startswith("_sessions/")) == [
        n for n in names if not n.startswith("_sessions/")
    ]
    # A truncated segment is named by verify too (the root's sha256 of it no longer matches).
    # Recovery an operator can do: drop the damaged root and point _latest back.
    ds.storage.delete(manifest_key(newest))
    ds.storage.delete("_latest")
    ds.advance_latest(newest - 1)
    run_local(config)
    outcome = exactly_once(dataset, expected)
    publish(
        "truncated_manifest",
        "the newest manifest root cut in half",
        outcome,
        rows=len(expected),
        faults=1,
        seconds=timer.seconds,
        result="readers, verify and the next run name the file; older versions read; after the "
        "root is dropped the rerun completes",
    )


def test_a_truncated_segment_or_pointer_is_named(dataset):
    ds = Dataset.open(dataset)
    root = json.loads(ds.storage.read_bytes(manifest_key(ds.latest_version())))
    key = root["segments"][-1]["key"]
    segment = Path(ds.storage.url(key))
    segment.write_bytes(segment.read_bytes()[:-20])
    report = verify_dataset(dataset)
    assert not report.ok and "does not match its sha256" in report.problems[0]
    pointer = Path(ds.storage.url("_latest"))
    pointer.write_bytes(pointer.read_bytes()[:5])
    with pytest.raises(DatasetError, match="unreadable pointer"):
        Dataset.open(dataset).latest_version()
