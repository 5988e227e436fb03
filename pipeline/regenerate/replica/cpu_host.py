"""Tuning for a CPU engine on a small host: the `cpu_host:` config section and what it drives.

vLLM's CPU build binds each model worker's OpenMP threads to cores of their
own. It leaves the engine-core process (which spin-waits on the worker), the
replica's feeder and its write-back free to run anywhere, so the kernel also
places them on the worker's cores, and every CPU-second of encoding there is
taken from the forward. After the engine is up, `place_host_work` reads
which CPUs the workers' threads are bound to (Linux affinity masks, nothing
guessed), moves the calling thread, the write-back process and the engine's
other processes onto the remaining CPUs, and the engine core onto the
workers' CPUs (on a CPU engine the two take turns: bench/RESULTS.md). Threads created afterwards (the
feeder and its pools) inherit the calling thread's mask. Where no worker is
bound (a GPU engine, a CPU engine started with
`VLLM_CPU_OMP_THREADS_BIND=nobind`), or the workers hold every CPU, it
changes nothing, so a GPU config never needs this section.
docs/capture.md ("Processes, Ray, parallelism") says why each setting is kept or
fixed; bench/RESULTS.md has the measurements.

The process tree, titles, threads and CPU times come from psutil (a
dependency of the stack already: accelerate, vLLM), not from reading /proc
by hand. `cpu_by_role` is the one figure here only measurements use (the
summary's `replicas[i].cpu_seconds`, bench/regenerate.py): two walks of the
replica's process tree per run, at `ready()` and at the end.
"""

from __future__ import annotations

import logging
import os

from pydantic import Field

from pipeline.config import ConfigModel
from pipeline.logs import kv

log = logging.getLogger(__name__)


class CpuHostConfig(ConfigModel):
    """`cpu_host`: settings that matter only for a CPU engine (no-ops on a GPU engine)."""

    # Move the replica's host work off the CPUs the engine's model workers are bound
    # to, and the engine core onto them (the module docstring).
    isolate_engine_cpus: bool = True
    # Python's GIL switch interval in the replica process (sys.setswitchinterval), in
    # ms: the engine thread gives the GIL up around every engine call, and Python's
    # 5 ms default can keep it waiting that long each time.
    gil_switch_interval_ms: float = Field(0.5, gt=0)


def tune_process(config: CpuHostConfig) -> None:
    """What applies before the engine starts: the GIL switch interval."""
    import sys

    sys.setswitchinterval(config.gil_switch_interval_ms / 1000)


def place_host_work(config: CpuHostConfig) -> set[int] | None:
    """After the engine is up: host work off the workers' CPUs, the engine core on them
    (`isolate_engine_cpus`); the host CPUs, or None where nothing moved."""
    if not config.isolate_engine_cpus:
        return None
    return isolate_host_work(engine_core_on_workers=True)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children first); [] where `pid` is gone."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def worker_cpus(pids: list[int], allowed: set[int]) -> set[int]:
    """CPUs that threads of model-worker processes among `pids` are bound to.

    A worker is a process whose command line names a worker (vLLM sets
    `VLLM::Worker...`); a thread counts as bound when its mask is narrower
    than `allowed` (ours). The engine core is not a worker: it is moved, not kept.
    """
    bound: set[int] = set()
    for pid in filter(_is_worker, pids):
        for thread in _threads(pid):
            try:
                cpus = os.sched_getaffinity(thread)
            except OSError:  # the thread ended
                continue
            if cpus < allowed:
                bound |= cpus
    return bound


def isolate_host_work(
    keep: set[int] = frozenset(), *, engine_core_on_workers: bool = False
) -> set[int] | None:
    """Move this thread and the engine's non-worker processes off the workers' CPUs.

    Processes in `keep` stay where they are. `engine_core_on_workers`: vLLM's
    engine-core process goes onto the workers' CPUs instead (on a CPU engine
    it works only while they wait for it, and spins with `sched_yield` while
    they compute; see docs/capture.md). Returns the CPUs host work now runs
    on, or None where nothing changed.
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    pids = descendants(os.getpid())
    bound = worker_cpus(pids, allowed)
    host = allowed - bound
    if not bound or not host:
        return None
    os.sched_setaffinity(0, host)
    for pid in (p for p in pids if not _is_worker(p) and p not in keep):
        cpus = bound if engine_core_on_workers and _is_engine_core(pid) else host
        for thread in _threads(pid):
            try:
                os.sched_setaffinity(thread, cpus)
            except OSError:  # ended, or not ours to move: leave it
                continue
    log.info(
        "host work kept off the engine workers' CPUs %s",
        kv(
            worker_cpus=_span(bound),
            host_cpus=_span(host),
            engine_core="workers" if engine_core_on_workers else "host",
        ),
    )
    return host


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (0.0 where it is gone)."""
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def cpu_by_role(writeback_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of this replica's processes: itself, its write-back process, its
    engine's model workers and the engine's other processes (the engine core)."""
    out = {"replica": cpu_seconds(os.getpid()), "writeback": 0.0, "workers": 0.0, "engine": 0.0}
    for pid in descendants(os.getpid()):
        role = "writeback" if pid == writeback_pid else "workers" if _is_worker(pid) else "engine"
        out[role] += cpu_seconds(pid)
    return {k: round(v, 2) for k, v in out.items()}


def engine_core_cpus() -> list[int] | None:
    """The CPUs this process's vLLM engine core may run on (None: no such process here)."""
    for pid in descendants(os.getpid()):
        if _is_engine_core(pid):
            try:
                return sorted(os.sched_getaffinity(pid))
            except OSError:  # it ended
                return None
    return None


def cmdline(pid: int) -> str:
    """A process's command line (its title, where it set one); "" where it is gone."""
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""


def _is_worker(pid: int) -> bool:
    """vLLM titles its model-worker processes `VLLM::Worker...`."""
    return "Worker" in cmdline(pid)


def _is_engine_core(pid: int) -> bool:
    """vLLM titles its engine-core process `VLLM::EngineCore...`."""
    return "EngineCore" in cmdline(pid)


def _span(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _threads(pid: int) -> list[int]:
    """Thread ids of a process ([] where it is gone)."""
    import psutil

    try:
        return [thread.id for thread in psutil.Process(pid).threads()]
    except psutil.Error:
        return []
