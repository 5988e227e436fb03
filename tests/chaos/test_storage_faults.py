"""Storage faults during a regeneration on S3: 10% of calls failing, the server restarted
mid-run, an outage longer than the retries, a multipart upload killed half-way."""

# ruff: noqa: F811  (fixtures imported from s3_server are redefined as arguments)

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from faults import Faults, install_faults
from s3_server import moto_endpoint, s3_uri  # noqa: F401  (fixtures)

from pipeline.regenerate.run import run_local
from pipeline.table.dataset import Dataset
from pipeline.table.gc import gc_dataset
from pipeline.table.inspection import verify_dataset
from pipeline.table.reader import ShardReader

from .common import Timer, exactly_once, expected_ids, publish, run_config

CHILD = Path(__file__).with_name("child.py")


def _retries(caplog) -> int:
    return sum("transient storage error, retrying" in r.getMessage() for r in caplog.records)


def test_ten_percent_of_storage_calls_fail(s3_uri, moto_endpoint, monkeypatch, caplog):
    """Resets, timeouts and 5xx on 10% of S3 calls (half of the failed writes after they
    landed, half of the failed reads mid-body), beneath the production retry policy."""
    caplog.set_level(logging.WARNING, logger="pipeline.storage")
    timer = Timer()
    # The faults are injected into this process's storage, so the shards are written here
    # too (the write-back's threads mode; its process mode would write from a child).
    config = run_config(
        s3_uri,
        endpoint_url=moto_endpoint,
        num_conversations=48,
        num_buckets=12,
        writeback={"mode": "threads"},
    )
    expected = expected_ids(config)
    faults = Faults(rate=0.1, seed=7)
    install_faults(monkeypatch, faults)
    summary = run_local(config)
    assert summary.units_done == summary.units_total and not summary.units_failed
    # Read back through the same faulty filesystem: the same rows, bit for bit.
    flaky = {
        s.sample_id: s.hidden_states
        for s in ShardReader(s3_uri, endpoint_url=moto_endpoint, prefetch=0)
    }
    faults.enabled = False
    outcome = exactly_once(s3_uri, expected, endpoint_url=moto_endpoint)
    clean = ShardReader(s3_uri, endpoint_url=moto_endpoint, prefetch=0)
    assert all(flaky[s.sample_id].equal(s.hidden_states) for s in clean)
    assert faults.num_injected >= 15, faults.injected
    assert _retries(caplog) >= faults.num_injected
    publish(
        "s3_calls_fail_10pct",
        "10% of S3 calls fail (reset, timeout, 500, 503); half of failed writes had landed",
        outcome,
        rows=len(expected),
        faults=faults.num_injected,
        seconds=timer.seconds,
        result="completed",
        calls=faults.num_calls,
    )


def test_the_s3_server_restarted_mid_run(restartable_s3, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="pipeline.storage")
    s3 = restartable_s3
    timer = Timer()
    config = run_config(s3.uri, endpoint_url=s3.endpoint, num_conversations=36, num_buckets=9)
    expected = expected_ids(config)
    ds = Dataset.open(s3.uri, endpoint_url=s3.endpoint)

    def restart_after_first_commit() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and ds.latest_version() is None:
            time.sleep(0.05)
        s3.stop()  # down for 1.5 s: every call in that window fails to connect
        time.sleep(1.5)
        s3.start()

    restarter = threading.Thread(target=restart_after_first_commit)
    restarter.start()
    summary = run_local(config)
    restarter.join()
    assert s3.restarts == 1 and not summary.units_failed
    assert summary.version > 1  # the run went on committing after the restart
    outcome = exactly_once(s3.uri, expected, endpoint_url=s3.endpoint)
    publish(
        "s3_server_restarted",
        "the S3 server stopped for 1.5 s after the first commit, then started again",
        outcome,
        rows=len(expected),
        faults=1,
        seconds=timer.seconds,
        result="completed",
        retries=_retries(caplog),
    )


def test_an_outage_longer_than_the_retries_stops_the_run_with_nothing_committed_lost(
    restartable_s3, short_lease
):
    s3 = restartable_s3
    timer = Timer()
    config = run_config(s3.uri, endpoint_url=s3.endpoint, num_conversations=36, num_buckets=9)
    expected = expected_ids(config)
    ds = Dataset.open(s3.uri, endpoint_url=s3.endpoint)

    def stop_after_first_commit() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and ds.latest_version() is None:
            time.sleep(0.05)
        s3.stop()

    stopper = threading.Thread(target=stop_after_first_commit)
    stopper.start()
    with pytest.raises(Exception) as failure:
        run_local(config)
    stopper.join()
    message = f"{type(failure.value).__name__}: {failure.value}"
    assert "Connect" in message or "connect" in message, message  # it names what failed
    s3.start()
    committed = ShardReader(s3.uri, endpoint_url=s3.endpoint, prefetch=0)
    before = {s.sample_id for s in committed}
    assert before and verify_dataset(s3.uri, endpoint_url=s3.endpoint).ok
    # The rerun waits out the failed run's lease (it could not release it), then finishes.
    run_local(config, lease_wait_s=short_lease.DEFAULT_TTL_S + 4 * short_lease.CLOCK_MARGIN_S)
    outcome = exactly_once(s3.uri, expected, endpoint_url=s3.endpoint)
    assert before <= {
        s.sample_id for s in ShardReader(s3.uri, endpoint_url=s3.endpoint, prefetch=0)
    }
    publish(
        "s3_outage_past_retries",
        "the S3 server down for good after the first commit (until the rerun)",
        outcome,
        rows=len(expected),
        faults=1,
        seconds=timer.seconds,
        result=f"clear error ({type(failure.value).__name__}), {len(before)} committed samples kept; rerun completed",
    )


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


def test_a_multipart_shard_upload_killed_half_way(s3_uri, moto_endpoint, monkeypatch):
    """A shard over the 16 MiB part size (a real multipart upload), its writer SIGKILLed
    after its first parts: nothing appears, gc aborts the upload, the redo commits."""
    from shards.helpers import provenance, sample, write_unit

    from pipeline.storage import s3 as s3mod

    timer = Timer()
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    ds = Dataset.open(s3_uri)
    small, samples_a = write_unit(ds, "unit-a", 4)
    ds.commit([small])
    proc = _spawn("write-big", s3_uri, "unit-big")
    storage = ds.storage
    parts = []
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not parts:
        for upload in storage.list_uploads("shards/"):
            parts = storage.fs.call_s3(
                "list_parts",
                Bucket=storage.bucket,
                Key=storage._key(upload.key),
                UploadId=upload.upload_id,
            ).get("Parts", [])
        time.sleep(0.05)
    assert parts, (
        f"the child never uploaded a part: {proc.stderr.read() if proc.poll() is not None else ''}"
    )
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert not [o.key for o in storage.list("shards/") if "unit-big" in o.key]  # nothing visible
    (left,) = storage.list_uploads("shards/")
    assert ds.latest_version() == 1 and verify_dataset(s3_uri).ok
    gc = gc_dataset(s3_uri, min_age_s=0, unsafe_min_age=True, delete=True)
    assert [u.key for u in gc.stale_uploads] == [left.key] and storage.list_uploads() == []
    # The redo: a new attempt of the unit, a multipart shard of three parts, committed.
    samples = [sample(i, "unit-big", num_tokens=4096) for i in range(64)]
    with ds.writer("unit-big", provenance()) as writer:
        for s in samples:
            writer.write(s)
    info = writer.info
    assert info.bytes > 2 * s3mod.PART_BYTES
    ds.commit([info])
    expected = {s.sample_id for s in samples_a + samples}
    outcome = exactly_once(s3_uri, expected)
    publish(
        "multipart_upload_killed",
        f"a shard's writer SIGKILLed after {len(parts)} part(s) of a multipart upload",
        outcome,
        rows=len(expected),
        faults=1,
        seconds=timer.seconds,
        result="nothing visible, upload aborted by gc, redo committed",
        shard_bytes=info.bytes,
    )
