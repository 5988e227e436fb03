"""Spool directories: named for their process; a dead process's idle spool is removed,
with the shared memory its engine left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid

from pipeline.targets.spool_dirs import (
    SEGMENTS_FILE,
    SHM_DIR,
    SPOOL_DIR_PREFIX,
    child_pids,
    make_spool_dir,
    record_engine_segments,
    remove_orphaned_spools,
)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _spool(parent, pid: int, *, age_s: float = 0.0):
    path = parent / f"{SPOOL_DIR_PREFIX}{pid}-abc123"
    path.mkdir()
    slot = path / ".free-7-3"
    slot.write_bytes(b"\0" * 4096)
    then = time.time() - age_s
    for p in (slot, path):
        os.utime(p, (then, then))
    return path


def test_a_killed_process_idle_spool_goes_and_the_rest_stay(tmp_path):
    dead = _dead_pid()
    orphan = _spool(tmp_path, dead, age_s=3600)
    recent = _spool(tmp_path, dead + 1_000_000, age_s=0)  # no such pid, but written just now
    live = _spool(tmp_path, os.getpid(), age_s=3600)
    foreign = tmp_path / f"{SPOOL_DIR_PREFIX}notapid"
    foreign.mkdir()
    os.utime(foreign, (0, 0))

    removed = remove_orphaned_spools(str(tmp_path), idle_s=600)

    assert removed == [str(orphan)]
    assert not orphan.exists()
    assert recent.exists() and live.exists() and foreign.exists()


def test_a_new_spool_is_named_for_its_process_and_clears_orphans(tmp_path):
    orphan = _spool(tmp_path, _dead_pid(), age_s=3600)
    made = make_spool_dir(str(tmp_path))
    assert os.path.basename(made).startswith(f"{SPOOL_DIR_PREFIX}{os.getpid()}-")
    assert os.path.isdir(made)
    assert not orphan.exists()


def _mapping_child(name: str):
    """A process mapping a 1 MiB shared-memory file `name` in SHM_DIR (as vLLM's rings are)."""
    code = (
        "import mmap, os, sys, time\n"
        f"fd = os.open({os.path.join(SHM_DIR, name)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
        "os.ftruncate(fd, 1 << 20)\n"
        "m = mmap.mmap(fd, 1 << 20)\n"
        "m[:5] = b'rings'\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_a_killed_engine_shared_memory_goes_with_its_orphaned_spool(tmp_path):
    tag = uuid.uuid4().hex[:10]
    before_engine = _mapping_child(f"psm_{tag}a")  # e.g. the write-back: started earlier
    before = child_pids()
    engine = _mapping_child(f"psm_{tag}b")
    spool = tmp_path / f"{SPOOL_DIR_PREFIX}{os.getpid()}-abc123"
    spool.mkdir()
    stray = tmp_path / "not-ours"
    stray.write_text("keep")
    try:
        assert record_engine_segments(str(spool), before) == [f"psm_{tag}b"]
        # A listing someone edited names only multiprocessing's shared memory in SHM_DIR.
        with open(spool / SEGMENTS_FILE, "a") as listing:
            listing.write(f"../{stray.name}\n{stray}\nsomething-else\n")
        for child in (engine, before_engine):
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert os.path.exists(os.path.join(SHM_DIR, f"psm_{tag}b"))  # SIGKILL unlinks nothing
        orphan = tmp_path / f"{SPOOL_DIR_PREFIX}{_dead_pid()}-abc123"
        spool.rename(orphan)
        old = time.time() - 3600
        for path in (*orphan.iterdir(), orphan):
            os.utime(path, (old, old))

        assert remove_orphaned_spools(str(tmp_path), idle_s=600) == [str(orphan)]
        assert not os.path.exists(os.path.join(SHM_DIR, f"psm_{tag}b"))
        assert os.path.exists(os.path.join(SHM_DIR, f"psm_{tag}a"))  # not the engine's
        assert stray.read_text() == "keep"
    finally:
        for child in (engine, before_engine):
            child.kill()
            child.wait()
        for suffix in "ab":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, f"psm_{tag}{suffix}"))
