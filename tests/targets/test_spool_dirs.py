"""Spool directories: named for their process; a dead process's idle spool is removed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from pipeline.targets.spool_dirs import SPOOL_DIR_PREFIX, make_spool_dir, remove_orphaned_spools


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
