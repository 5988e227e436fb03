"""The driver SIGKILLed after it committed some units, then resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.regenerate.run import run_local
from pipeline.table.dataset import Dataset
from pipeline.table.gc import gc_dataset
from pipeline.table.lease import LeaseHeld
from pipeline.table.reader import ShardReader

from .common import Timer, exactly_once, expected_ids, publish, run_config

CHILD = Path(__file__).with_name("child.py")


def test_the_driver_sigkilled_mid_run_then_resumed(tmp_path, short_lease):
    timer = Timer()
    uri = str(tmp_path / "dataset")
    config = run_config(uri, num_conversations=60, num_buckets=15)
    expected = expected_ids(config)
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), "run", json.dumps(config.model_dump(mode="json")), "6"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    ds = Dataset.open(uri)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if (ds.latest_version() or 0) >= 2:
            break
        time.sleep(0.02)
    assert proc.poll() is None, (
        f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
    )
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    killed_at = ds.latest_version()
    before = [s.sample_id for s in ShardReader(uri, prefetch=0)]
    assert 0 < len(before) < len(expected) and len(set(before)) == len(before)
    # A resume right away is refused, naming the dead driver that still holds the lease.
    with pytest.raises(LeaseHeld, match="chaos regenerate"):
        run_local(config)
    summary = run_local(
        config, lease_wait_s=short_lease.DEFAULT_TTL_S + 4 * short_lease.CLOCK_MARGIN_S
    )
    assert summary.units_skipped > 0 and summary.units_done > 0  # only the rest was redone
    outcome = exactly_once(uri, expected)
    assert set(before) <= {s.sample_id for s in ShardReader(uri, prefetch=0)}
    # What the killed driver wrote and never committed is garbage, never a sample twice.
    orphans = [
        o.key
        for o in gc_dataset(uri, min_age_s=0, unsafe_min_age=True).garbage
        if o.key.startswith("shards/")
    ]
    publish(
        "driver_sigkilled",
        f"the driver SIGKILLed after committing version {killed_at}, then rerun",
        outcome,
        rows=len(expected),
        faults=1,
        seconds=timer.seconds,
        result="resume refused while the dead driver's lease lived, then redid only the rest",
        orphan_shards=len(orphans),
    )
