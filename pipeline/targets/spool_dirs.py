"""Where capture spools live: one directory per capture engine, named for its process.

The engine's model worker writes a spool file every step into tmpfs
(capture_chunks.py), so a spool directory holds RAM: its recycled slots and
any steps not read yet. The engine's owner removes it on close, but a process
killed with SIGKILL (Ray restarting a replica, the kernel's OOM killer) runs
no cleanup, and its spool would stay in /dev/shm until the machine reboots.
So each directory carries its creator's pid, and a new capture engine first
removes the directories whose creator is gone and which nothing has written
to for a while (a pid can be reused, and another pid namespace can share
/dev/shm: a directory still being written is never touched).

vLLM's own shared memory goes the same way: its engine core and workers talk
through rings that Python's `SharedMemory` keeps in /dev/shm (`psm_*`, 400
MB for one toy engine on CPU) beside multiprocessing's semaphores
(`sem.mp-*`), and a SIGKILLed owner's engine unlinks none of them (Ray ends
the processes, nobody removes the names). Once its engine is up, the owner
lists those its engine's processes map in the spool (`record_engine_segments`);
removing an orphaned spool removes them too.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from pipeline.logs import kv

log = logging.getLogger(__name__)

SPOOL_DIR_PREFIX = "dspark-capture-"
ORPHAN_IDLE_S = 600.0  # unwritten this long, with its creator gone: left behind
SHM_DIR = "/dev/shm"  # where POSIX shared memory and named semaphores live on Linux
SEGMENTS_FILE = "engine-shm-segments"  # in a spool: its engine's names in SHM_DIR
# multiprocessing's names: SharedMemory segments (vLLM's rings) and named semaphores
SEGMENT_PREFIXES = ("psm_", "sem.mp-")


def spool_parent() -> str | None:
    """tmpfs where there is one (no disk I/O on the worker's path), else the temp dir."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def make_spool_dir(parent: str | None = None) -> str:
    """A fresh spool directory for this process, once the orphans under `parent` are gone."""
    parent = parent or spool_parent() or tempfile.gettempdir()
    remove_orphaned_spools(parent)
    return tempfile.mkdtemp(prefix=f"{SPOOL_DIR_PREFIX}{os.getpid()}-", dir=parent)


def remove_orphaned_spools(parent: str, *, idle_s: float = ORPHAN_IDLE_S) -> list[str]:
    """Remove the spool directories under `parent` whose creating process is gone and
    which nothing wrote to for `idle_s` seconds; their paths."""
    removed = []
    try:
        entries = list(Path(parent).glob(f"{SPOOL_DIR_PREFIX}*"))
    except OSError:
        return removed
    import psutil

    now = time.time()
    for path in entries:
        pid = _creator(path.name)
        if pid is None or psutil.pid_exists(pid) or now - _last_write(path) < idle_s:
            continue
        size = _size(path) + _unlink_segments(path)
        # ignore_errors: two engines starting on one node may remove the same orphan.
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            log.info(
                "removed the capture spool and engine shared memory a killed process left %s",
                kv(dir=path, bytes=size),
            )
            removed.append(str(path))
    return removed


def child_pids() -> set[int]:
    """This process's descendants now (taken before an engine starts, to tell its own)."""
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def record_engine_segments(spool_dir: str, before: set[int]) -> list[str]:
    """List in `spool_dir` the shared-memory names (`SEGMENT_PREFIXES`) mapped by this
    process's descendants not in `before` (`child_pids()` taken before the engine started:
    its core and workers, not e.g. the write-back); the names. The list goes with the
    spool: removing an orphaned spool unlinks them."""
    import psutil

    names: set[str] = set()
    for child in psutil.Process().children(recursive=True):
        if child.pid in before:
            continue
        try:
            maps = child.memory_maps()
        except psutil.Error:  # ended, or not ours to read
            continue
        for region in maps:
            if region.path.endswith(" (deleted)"):  # unlinked already
                continue
            folder, _, name = region.path.rpartition("/")
            if folder == SHM_DIR and name.startswith(SEGMENT_PREFIXES):
                names.add(name)
    listing = os.path.join(spool_dir, SEGMENTS_FILE)
    with open(f"{listing}.tmp", "w") as out:
        out.write("".join(f"{n}\n" for n in sorted(names)))
    os.replace(f"{listing}.tmp", listing)
    return sorted(names)


def _unlink_segments(spool: Path) -> int:
    """Unlink the shared-memory names an orphaned spool lists; the bytes they held."""
    try:
        names = (spool / SEGMENTS_FILE).read_text().splitlines()
    except OSError:
        return 0
    freed = 0
    for name in names:
        if "/" in name or not name.startswith(SEGMENT_PREFIXES):  # not a name we list
            continue
        path = os.path.join(SHM_DIR, name)
        try:
            size = os.stat(path).st_size
            os.unlink(path)
        except OSError:  # gone already
            continue
        freed += size
    return freed


def _creator(name: str) -> int | None:
    """The pid in `dspark-capture-<pid>-<random>` (None: not a name this module made)."""
    pid, sep, _ = name.removeprefix(SPOOL_DIR_PREFIX).partition("-")
    return int(pid) if sep and pid.isdigit() else None


def _last_write(path: Path) -> float:
    """The latest modification time of the directory or any file in it (0: unreadable)."""
    try:
        return max([path.stat().st_mtime, *(f.stat().st_mtime for f in path.iterdir())])
    except OSError:
        return 0.0


def _size(path: Path) -> int:
    """Bytes of the files in a spool directory (what removing it frees; 0: gone meanwhile)."""
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except OSError:
        return 0
