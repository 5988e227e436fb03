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

from pipeline.regenerate.driver.scheduler import SchedulerLimits, UnitScheduler
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

    async def hungry(self) -> bool:
        await asyncio.sleep(0.01)
        return True  # as a replica whose units are all in their last turns

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


def _pid_after_restart(ray, actor, timeout_s: float = 60.0) -> int:
    from ray.exceptions import ActorUnavailableError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get(actor.ready.remote(), timeout=timeout_s)["pid"]
        except ActorUnavailableError:  # still restarting
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


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
    actors = [r.actor for r in scheduler.replicas]
    pids = ray_local.get([a.ready.remote() for a in actors])
    report = scheduler.run(units, lambda unit, result: done.append(result))
    assert sorted(done) == sorted(["ok-1", "ok-2", "ok-3", "transient-1", "crash-1", "hang-1"])
    assert len(done) == len(set(done))  # every unit finished exactly once
    assert list(report.failed) == ["bad-1"] and "ValueError" in report.failed["bad-1"]
    assert report.retries >= 3  # transient, crash, hang
    # The crashed replica and the killed hung one both came back as new processes
    # (the run may end before the scheduler's probe of the second one answers).
    assert report.replicas_restarted >= 1 and report.replicas_lost == 0
    assert all(
        _pid_after_restart(ray_local, a) != p["pid"] for a, p in zip(actors, pids, strict=True)
    )


def test_a_unit_fails_for_good_after_its_attempts(ray_local, tmp_path):
    done: list[str] = []
    scheduler = _scheduler(ray_local, tmp_path / "x", num=1, max_unit_attempts=1)
    (tmp_path / "x").mkdir()
    report = scheduler.run(_units("transient-2", "ok-4"), lambda u, r: done.append(r))
    assert done == ["ok-4"]
    assert "1 attempts" in report.failed["transient-2"]


def test_a_hungry_replica_takes_units_up_to_its_ceiling(ray_local, tmp_path):
    remote = ray_local.remote(StandIn).options(max_restarts=0)
    units = _units(*(f"ok-h{i}" for i in range(8)))
    for hunger, expected in ((None, 1), (lambda actor: actor.hungry.remote(), 3)):
        actor = remote.remote(str(tmp_path))
        scheduler = UnitScheduler(
            [actor],
            [1],
            lambda actor, unit: actor.regenerate.remote(unit),
            SchedulerLimits(poll_seconds=0.2),
            hunger=hunger,
            ceilings=[3],
        )
        done: list[str] = []
        report = scheduler.run(units, lambda unit, result, done=done: done.append(result))
        assert sorted(done) == sorted(u.unit_id for u in units)  # each once
        assert report.peak_units == [expected]
        ray_local.kill(actor)
