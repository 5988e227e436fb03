"""Crashes and races with real processes: SIGKILL mid-write and between data and manifest,
and two committer processes racing for the same version (local disk and loopback S3)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from shards.helpers import write_unit

from pipeline.table.dataset import Dataset
from pipeline.table.gc import gc_dataset
from pipeline.table.inspection import verify_dataset
from pipeline.table.reader import ShardReader

CHILD = Path(__file__).with_name("child.py")


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


def _wait_for(proc: subprocess.Popen, word: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if word in line:
            return line
        if not line and proc.poll() is not None:
            raise AssertionError(f"child exited {proc.returncode}: {proc.stderr.read()}")
    raise AssertionError(f"child never printed {word}")


def _committed_v1(root: str) -> tuple[Dataset, list[str]]:
    ds = Dataset.open(root)
    info, samples = write_unit(ds, "unit-a", 4)
    ds.commit([info])
    return ds, [s.sample_id for s in samples]


def test_kill_mid_write_leaves_no_partial_shard(root):
    ds, ids_v1 = _committed_v1(root)
    proc = _spawn("write-forever", root, "unit-b")
    _wait_for(proc, "WRITING")  # several row groups are out of the writer by now
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    names = [o.key for o in ds.storage.list("shards/")]
    assert not [k for k in names if k.startswith("shards/unit-b.")]  # nothing under a real name
    assert ds.latest_version() == 1
    assert [s.sample_id for s in ShardReader(root)] == ids_v1
    assert verify_dataset(root).ok
    if not root.startswith("s3://"):
        # Local disk keeps the killed writer's hidden temp file; gc finds it.
        leftovers = [o.key for o in gc_dataset(root, min_age_s=0, unsafe_min_age=True).garbage]
        assert len(leftovers) == 1 and leftovers[0].startswith("shards/.unit-b.")
        assert ".parquet.tmp-" in leftovers[0]


def test_kill_between_data_and_manifest_then_resume(root):
    ds, ids_v1 = _committed_v1(root)
    proc = _spawn("write-then-die", root, "unit-b", "3")
    _wait_for(proc, "WRITTEN")
    assert proc.wait(timeout=30) == -signal.SIGKILL
    # The shard file is complete, but no manifest names it: it does not exist for readers.
    (orphan,) = [o.key for o in ds.storage.list("shards/") if o.key.startswith("shards/unit-b.")]
    assert ds.latest_version() == 1
    assert ds.committed_units() == {"unit-a"}  # resume redoes unit-b
    assert [s.sample_id for s in ShardReader(root)] == ids_v1
    assert [o.key for o in gc_dataset(root, min_age_s=0, unsafe_min_age=True).garbage] == [orphan]
    # Resume: the unit is redone (a new attempt, a new name) and committed exactly once.
    info, samples = write_unit(ds, "unit-b", 3)
    assert info.path != orphan
    ds.commit([info])
    got = [s.sample_id for s in ShardReader(root)]
    assert got == ids_v1 + [s.sample_id for s in samples]
    assert len(set(got)) == len(got)
    assert [o.key for o in gc_dataset(root, min_age_s=0, unsafe_min_age=True).garbage] == [orphan]


def test_two_committer_processes_race_for_one_version(root, tmp_path):
    ds, _ = _committed_v1(root)
    go = tmp_path / "go"
    procs = []
    for unit in ("unit-x", "unit-y"):
        info, _ = write_unit(ds, unit, 3)
        fields = {**dataclasses.asdict(info), "provenance": info.provenance.to_dict()}
        procs.append(_spawn("race", root, json.dumps(fields), str(go)))
    for proc in procs:
        _wait_for(proc, "READY")
    go.touch()
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    codes = sorted(proc.returncode for proc in procs)
    assert codes == [0, 3], outputs
    assert sum("WON v2" in out for out in outputs) == 1
    loser = next(out for out in outputs if "CONFLICT" in out)
    assert "version 2 was committed by another writer" in loser
    units = {s.unit_id for s in ds.manifest(2).shards}
    assert units in ({"unit-a", "unit-x"}, {"unit-a", "unit-y"})
    assert ds.latest_version() == 2
    # The loser's shard, and the sample index and segment its commit wrote, are garbage.
    garbage = sorted(
        o.key.split("/")[0] for o in gc_dataset(root, min_age_s=0, unsafe_min_age=True).garbage
    )
    assert garbage == ["index", "manifests", "shards"]
