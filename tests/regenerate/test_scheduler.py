"""The unit scheduler on a real local Ray, with faults injected on purpose by a stand-in replica.

The stand-in has the replica's calls (`regenerate`, `ready`, `stats`) and no
engine: each unit's id says which fault it meets (a transient storage error
once, a deterministic error, a crash of the replica, a hung engine).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from pipeline.regenerate.scheduler import SchedulerLimits, UnitScheduler
from pipeline.regenerate.units import WorkUnit

pytestmark = pytest.mark.slow


def _by_value() -> None:
    """Ship the stand-in's code to Ray's workers (tests/ is not on their path)."""
    import sys

    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_by_value()


class StandIn:
    def __init__(self, marks: str) -> None:
        self.marks = Path(marks)
        self.started = None

    def ready(self) -> dict:
        return {"pid": os.getpid(), "units_wanted": 2}

    def stats(self) -> dict:
        hung = self.started is not None
        return {
            "in_flight": 1 if hung else 0,
            "seconds_since_step": time.monotonic() - self.started if hung else 0.0,
        }

    async def regenerate(self, unit: WorkUnit) -> str:
        kind = unit.unit_id.split("-")[0]
        mark = self.marks / unit.unit_id
        first = not mark.exists()
        mark.touch()
        if kind == "transient" and first:
            raise TimeoutError("storage read timed out")
        if kind == "bad":
            raise ValueError("sample 'x' has a malformed tensor")
        if kind == "crash" and first:
            os._exit(1)
        if kind == "hang" and first:
            self.started = time.monotonic()
            await asyncio.sleep(3600)
        await asyncio.sleep(0.05)
        return unit.unit_id


def _units(*names: str) -> list[WorkUnit]:
    return [WorkUnit(name, i, ()) for i, name in enumerate(names)]


def _scheduler(ray, tmp_path, num: int = 2, **limits) -> UnitScheduler:
    remote = ray.remote(StandIn).options(max_restarts=2, max_task_retries=0)
    actors = [remote.remote(str(tmp_path)) for _ in range(num)]
    ray.get([a.ready.remote() for a in actors])
    settings = dict(poll_seconds=0.2, replica_stall_timeout_s=3.0, retry_base_delay_s=0.05)
    settings.update(limits)
    return UnitScheduler(
        actors,
        [2] * num,
        lambda actor, unit: actor.regenerate.remote(unit),
        SchedulerLimits(**settings),
    )


def test_transient_retried_deterministic_not_crash_and_hang_fail_over(ray_local, tmp_path):
    done: list[str] = []
    scheduler = _scheduler(ray_local, tmp_path)
    units = _units("ok-1", "ok-2", "transient-1", "bad-1", "crash-1", "hang-1", "ok-3")
    report = scheduler.run(units, lambda unit, result: done.append(result))
    assert sorted(done) == sorted(["ok-1", "ok-2", "ok-3", "transient-1", "crash-1", "hang-1"])
    assert len(done) == len(set(done))  # every unit finished exactly once
    assert list(report.failed) == ["bad-1"] and "ValueError" in report.failed["bad-1"]
    assert report.retries >= 3  # transient, crash, hang
    assert report.replicas_restarted >= 2  # the crashed one and the killed hung one


def test_a_unit_fails_for_good_after_its_attempts(ray_local, tmp_path):
    done: list[str] = []
    scheduler = _scheduler(ray_local, tmp_path / "x", num=1, max_unit_attempts=1)
    (tmp_path / "x").mkdir()
    report = scheduler.run(_units("transient-2", "ok-4"), lambda u, r: done.append(r))
    assert done == ["ok-4"]
    assert "1 attempts" in report.failed["transient-2"]
