"""Replica processes SIGKILLed five times in one run, on a real local Ray.

The replicas are the production actor (`RegenerateReplica`) on the
transformers backend (an engine start takes seconds, not vLLM's ~25 s, so
five restarts fit the suite); the kill is the same SIGKILL of the actor's
process that tests/regenerate/test_run.py gives a vLLM replica once.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from ray.exceptions import GetTimeoutError, RayActorError

from pipeline.regenerate.run import run_regenerate

from .common import Timer, exactly_once, expected_ids, publish, run_config

NUM_KILLS = 5


def test_replicas_sigkilled_five_times_in_one_run(tmp_path, ray_local, monkeypatch):
    import pipeline.regenerate.driver.pool as pool

    started: list = []  # the run's actor handles, as start_replicas returns them
    real_start = pool.start_replicas

    def start_replicas(*args, **kwargs):
        actors, ready = real_start(*args, **kwargs)
        started.extend(actors)
        return actors, ready

    monkeypatch.setattr(pool, "start_replicas", start_replicas)
    timer = Timer()
    config = run_config(
        str(tmp_path / "dataset"),
        num_conversations=160,
        num_buckets=40,
        max_new_tokens=32,
        max_unit_attempts=8,
    )
    config = config.model_copy(
        update={
            "replicas": config.replicas.model_copy(
                update={"num_replicas": 2, "num_cpus": 1, "max_restarts": 4}
            )
        }
    )
    expected = expected_ids(config)
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["summary"] = run_regenerate(config, show_progress=False)
        except BaseException as err:  # shown by the assertion below
            outcome["error"] = err

    runner = threading.Thread(target=run)
    runner.start()
    kills: list[int] = []
    deadline = time.monotonic() + 900
    while len(kills) < NUM_KILLS and runner.is_alive() and time.monotonic() < deadline:
        index = len(kills) % 2
        try:
            if not started:
                raise ValueError("replicas not started yet")
            actor = started[index]
            stats = ray_local.get(actor.stats.remote(), timeout=30)
            if stats.get("requests"):  # its engine has requests of its units in flight
                pid = ray_local.get(actor.ready.remote(), timeout=30)["pid"]
                os.kill(pid, signal.SIGKILL)
                kills.append(pid)
                continue
        except (ValueError, GetTimeoutError, RayActorError, ProcessLookupError):
            pass  # not created yet, loading its engine, or restarting
        time.sleep(0.05)
    runner.join(timeout=900)
    assert not runner.is_alive()
    assert "error" not in outcome, repr(outcome.get("error"))
    assert len(kills) == NUM_KILLS, f"the run ended after {len(kills)} kills"
    summary = outcome["summary"]
    assert not summary.units_failed and summary.retries >= NUM_KILLS
    result = exactly_once(config.output.uri, expected)
    publish(
        "replicas_sigkilled",
        f"replica processes SIGKILLed {NUM_KILLS} times in one run (2 replicas, Ray restarts)",
        result,
        rows=len(expected),
        faults=len(kills),
        seconds=timer.seconds,
        result="completed",
        unit_retries=summary.retries,
    )
