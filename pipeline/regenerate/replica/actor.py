"""The replica actor: one target replica, fed continuously, writing its units' shards.

The actor is a thin wrapper around a capturing backend and the
`EngineFeeder`; all logic lives there and in `unit_job.py`, so it is testable
without Ray. `driver/pool.py` starts, places and stops these actors.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from pipeline.regenerate.config import RegenerateConfig
from pipeline.regenerate.replica.cpu_host import (
    CpuHostConfig,
    cpu_by_role,
    engine_core_cpus,
    place_host_work,
    tune_process,
)
from pipeline.regenerate.replica.feeder import EngineFeeder, FeedLimits
from pipeline.regenerate.replica.writeback_process import start_writeback
from pipeline.regenerate.units import UnitResult, UnitSpec, WorkUnit
from pipeline.targets.config import TargetConfig

log = logging.getLogger(__name__)


class RegenerateReplica:
    """The replica actor's body: one capturing backend, fed continuously by an `EngineFeeder`.

    An async actor: every in-flight unit is one awaiting `regenerate` call
    (Ray runs up to 1000 at once), while the feeder's thread keeps the
    engine stepping. If the engine fails the process exits, so Ray restarts
    the actor with a fresh engine and the driver retries its units.
    """

    def __init__(
        self,
        target: TargetConfig,
        regenerate: RegenerateConfig,
        cpu_host: CpuHostConfig | None = None,
    ) -> None:
        from transformers import AutoTokenizer

        from pipeline.logs import quiet_engine_output, setup_logging
        from pipeline.targets.loader import load_target
        from pipeline.targets.resolve import resolve_model

        setup_logging()
        quiet_engine_output()
        cpu_host = cpu_host or CpuHostConfig()
        tune_process(cpu_host)
        # The write-back starts first, so a process's imports overlap the engine's start.
        writeback = start_writeback(
            regenerate.writeback, spill_above_bytes=regenerate.spill_above_bytes
        )
        started = time.monotonic()
        self.backend = load_target(target, capture=True)
        self.start_seconds = time.monotonic() - started
        # Before the feeder exists: its thread and pools inherit this thread's CPUs, and
        # the write-back process moves with them.
        self.host_cpus = place_host_work(cpu_host)
        self.engine_core_cpus = engine_core_cpus()  # read once: stats() is polled
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model(target.model), revision=target.revision
        )
        self.limits = feed_limits(regenerate, self.backend.max_concurrency)
        self.units_wanted = regenerate.units_in_flight(self.limits.max_requests_in_flight)
        self.max_units = regenerate.max_units_in_flight(self.limits.max_requests_in_flight)
        self.writeback_mode = regenerate.writeback.mode
        self.feeder = EngineFeeder(
            self.backend, tokenizer, self.limits, on_fatal=_exit_process, writeback=writeback
        )
        self._cpu_at_ready: dict[str, float] = {}

    def ready(self) -> dict[str, Any]:
        """Process id, engine start seconds and how many units to keep in flight here."""
        self._cpu_at_ready = self._cpu()  # stats() counts the steady state from here
        return {
            "pid": os.getpid(),
            "start_seconds": self.start_seconds,
            "units_wanted": self.units_wanted,
            "max_units": self.max_units,
            "max_requests_in_flight": self.limits.max_requests_in_flight,
            "host_cpus": sorted(self.host_cpus) if self.host_cpus else None,
        }

    async def regenerate(self, unit: WorkUnit, spec: UnitSpec) -> UnitResult:
        import asyncio

        return await asyncio.wrap_future(self.feeder.submit_unit(unit, spec))

    async def hungry(self) -> bool:
        """Answers once the engine runs short of work with the units held (driver/scheduler.py)."""
        import asyncio

        return await asyncio.wrap_future(self.feeder.hungry())

    def stats(self) -> dict[str, Any]:
        """The feeder's counters (steps, peak captured bytes, ...) and the write-back's."""
        wb = self.feeder.writeback.stats()
        return {
            **self.feeder.stats.__dict__,
            **self.feeder.health(),
            "encode_seconds": wb.encode_seconds,
            "encoded_bytes": wb.encoded_bytes,
            "spilled_bytes": wb.spilled_bytes,
            "writeback": self.writeback_mode,
            # CPU seconds of this replica's processes since ready(): where the host went.
            "cpu_seconds": {
                k: round(v - self._cpu_at_ready.get(k, 0.0), 2) for k, v in self._cpu().items()
            },
            "writeback_peak_bytes": wb.peak_nbytes,
            "max_capture_bytes": self.limits.max_capture_bytes,
            "units_wanted": self.units_wanted,
            "max_units": self.max_units,
            "host_cpus": sorted(self.host_cpus) if self.host_cpus else None,
            "engine_core_cpus": self.engine_core_cpus,
        }

    def _cpu(self) -> dict[str, float]:
        return cpu_by_role(self.feeder.writeback.stats().pid)

    def close(self) -> None:
        """Stop the feeder and the engine, remove the capture spool (ray.kill runs no finalizer)."""
        self.feeder.close()
        self.backend.close()


def feed_limits(regenerate: RegenerateConfig, engine_concurrency: int) -> FeedLimits:
    """The feeder's admission limits under a regeneration config, for an engine that runs
    `engine_concurrency` requests at once (vLLM's max_num_seqs)."""
    return FeedLimits(
        max_requests_in_flight=regenerate.requests_in_flight(engine_concurrency),
        max_capture_bytes=regenerate.max_capture_memory_mb << 20,
    )


def _exit_process(error: BaseException) -> None:
    """A dead engine leaves the actor useless: exit, so Ray restarts it with a fresh one."""
    log.error("replica exits after an engine failure: %r", error)
    os._exit(1)
