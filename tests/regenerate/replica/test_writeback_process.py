"""The write-back process: real child processes, real shards, real kills.

What the feeder relies on: rows handed over become the same shard a
threads write-back writes; the child runs at the lower priority it was
given; a failed write comes back as an error that names it; a dead child
fails its units and tells the owner; a SIGKILLed owner leaves no child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from shards.helpers import provenance, sample

from pipeline.regenerate.replica.pending import PendingSample
from pipeline.regenerate.replica.writeback import ShardTarget, ShardWriteback, WritebackConfig
from pipeline.regenerate.replica.writeback_process import ProcessWriteback, WritebackFailed
from pipeline.table.dataset import Dataset
from pipeline.table.reader import ShardReader
from pipeline.targets.base import CapturedStates, Generation, HeldRows

ROOT = Path(__file__).resolve().parents[3]


def pending(index: int, unit: str = "u-1") -> PendingSample:
    """The shards helpers' sample `index`, as a unit hands it to the write-back."""
    s = sample(index, unit)
    ids = list(s.input_ids)
    rows = HeldRows(CapturedStates(s.hidden_states, s.last_hidden_state))
    gen = Generation(
        s.sample_id, ids[: s.num_prompt_tokens], ids[s.num_prompt_tokens :], s.finish_reason, rows
    )
    return PendingSample(s.source, s.domain, gen)


def _write(writeback, uri: str, samples) -> Future:
    prov = provenance()
    for s in samples:
        writeback.add("u-1", s, provenance=prov, where=f"row {s.sample_id}")
    done: Future = Future()

    def finish(written, error):
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(written)

    writeback.finish("u-1", ShardTarget(uri, None, prov), [], finish)
    writeback.flush()  # what the feeder does after each engine step
    return done


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[16])


def test_a_process_writes_the_shard_threads_write(tmp_path):
    samples = [pending(i) for i in (5, 1, 3, 0, 4, 2)]  # arrival order, not id order
    threads = ShardWriteback()
    process = ProcessWriteback(WritebackConfig(nice=7))
    process.bind(None)  # no engine spool: the rows come in memory
    try:
        deadline = time.monotonic() + 60  # the child renices itself as it starts
        while _nice(process.pid) != _nice(os.getpid()) + 7 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _nice(process.pid) == _nice(os.getpid()) + 7  # below the engine's processes
        by_threads = _write(threads, str(tmp_path / "threads"), samples).result(timeout=120)
        by_process = _write(process, str(tmp_path / "process"), samples).result(timeout=120)
        stats = process.stats()
        assert process.nbytes == stats.nbytes == 0 and stats.peak_nbytes > 0  # all released
        assert stats.encoded_bytes == threads.stats().encoded_bytes > 0
        assert stats.pid == process.pid and threads.stats().pid is None
    finally:
        threads.close()
        process.close()
    assert by_process.shard.rows == by_threads.shard.rows == len(samples)
    ds = Dataset.open(tmp_path / "process")
    ds.commit([by_process.shard])
    ids = [s.sample_id for s in ShardReader(ds, prefetch=0)]
    assert ids == sorted(s.sample_id for s in samples)  # sample-id order, each once
    # Same rows, same codec frames: the files differ only in their attempt tokens.
    assert by_process.shard.bytes == by_threads.shard.bytes


def test_a_failed_write_comes_back_named(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the dataset's directory should be")
    process = ProcessWriteback(WritebackConfig())
    process.bind(None)
    try:
        with pytest.raises(WritebackFailed) as failure:
            _write(process, str(blocker / "ds"), [pending(0)]).result(timeout=120)
    finally:
        process.close()
    assert "not-a-dir" in str(failure.value)


def test_a_dead_child_fails_its_units_and_tells_the_owner():
    lost = threading.Event()
    process = ProcessWriteback(WritebackConfig())
    process.bind(None, on_fatal=lambda err: lost.set())
    try:
        prov = provenance()
        process.add("u-1", pending(0), provenance=prov, where="row 0")
        os.kill(process.pid, signal.SIGKILL)
        assert lost.wait(timeout=30)
        done: Future = Future()
        process.finish(
            "u-1",
            ShardTarget("unused", None, prov),
            [],
            lambda written, error: done.set_exception(error),
        )
        with pytest.raises(WritebackFailed, match="write-back process"):
            done.result(timeout=5)
    finally:
        process.close()


def test_a_sigkilled_owner_leaves_no_child(tmp_path):
    script = textwrap.dedent(
        """
        import sys, time
        from pipeline.regenerate.replica.writeback_process import ProcessWriteback
        if __name__ == "__main__":
            wb = ProcessWriteback()
            print(wb.pid, flush=True)
            time.sleep(600)
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(owner.stdout.readline())
        assert Path(f"/proc/{child}").exists()
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _alive(child):
            time.sleep(0.1)
        assert not _alive(child)
    finally:
        owner.kill()


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="named semaphores live in /dev/shm")
def test_a_closed_write_back_leaves_no_semaphore_behind():
    """Ray ends a replica with SIGKILL after `close`, its process tree with it: no
    finalizer runs, and multiprocessing's resource tracker (which would unlink the
    queue's semaphores) dies too. `close` itself must leave nothing in /dev/shm."""
    import psutil

    script = textwrap.dedent(
        """
        import os, time
        from pipeline.regenerate.replica.writeback_process import ProcessWriteback
        if __name__ == "__main__":
            for _ in range(5):  # the queue's feeder thread ends in a race: run it often
                wb = ProcessWriteback()
                q = wb._to_child
                names = [lock._semlock.name for lock in (q._rlock, q._wlock, q._sem)]
                files = ["/dev/shm/sem." + n.lstrip("/") for n in names]
                there = all(os.path.exists(f) for f in files)
                del q  # the write-back's reference is the only one
                wb.close()
                gone = not any(os.path.exists(f) for f in files)
                print(there, gone, *names, flush=True)
            print("closed", flush=True)
            time.sleep(600)
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        files = []
        for _ in range(5):
            there, gone, *names = owner.stdout.readline().split()
            assert there == "True" and len(names) == 3  # the names are the files
            assert gone == "True"  # when `close` returns, not when a thread gets to it
            files += [Path("/dev/shm") / f"sem.{name.lstrip('/')}" for name in names]
        assert owner.stdout.readline().strip() == "closed"
        for process in [*psutil.Process(owner.pid).children(recursive=True)]:
            process.kill()  # the resource tracker, as Ray kills a worker's children
        owner.kill()
        owner.wait(timeout=30)
        assert [f.name for f in files if f.exists()] == []
    finally:
        owner.kill()


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (its parent is gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
