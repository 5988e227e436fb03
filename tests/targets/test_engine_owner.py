"""An engine's processes end when the process that started them is killed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from pipeline.targets.engine_owner import OWNER_ENV, watch_owner

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for an engine process: it watches the process that started it.
CHILD = """
import os, signal, sys, time
from pipeline.targets.engine_owner import watch_owner
if sys.argv[1] == "ignore":  # a process that does not stop on SIGTERM
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[1] == "late":  # orphaned before it loads the watch (a slow start)
    parent = os.getppid()
    print("waiting", flush=True)
    while os.getppid() == parent:
        time.sleep(0.05)
    print(os.getppid(), flush=True)
assert watch_owner(poll_s=0.05, grace_s=0.5)
print("watching", flush=True)
time.sleep(600)
"""

# The owner: names itself, starts the child, waits to be killed.
OWNER = """
import os, subprocess, sys, time
env = {**os.environ, %r: str(os.getpid())}
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env)
print(child.pid, flush=True)
time.sleep(600)
"""


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def _owner_and_child(mode: str):
    """An owner process and the child it started in `mode` (CHILD's argument)."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER % OWNER_ENV, CHILD, mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(owner.stdout.readline())
    try:
        yield owner, child
    finally:
        owner.kill()
        if psutil.pid_exists(child):
            psutil.Process(child).kill()


@pytest.mark.parametrize("on_sigterm", ["stop", "ignore"])
def test_a_process_ends_when_the_owner_that_started_it_is_killed(on_sigterm):
    with _owner_and_child(on_sigterm) as (owner, child):
        assert owner.stdout.readline().strip() == "watching"
        time.sleep(0.3)
        assert not _gone(child, 0.0)  # watching does not end a process whose owner lives
        owner.kill()
        owner.wait(timeout=10)
        assert _gone(child, 5.0)  # SIGTERM, or the grace period's end when it is ignored


def test_a_process_orphaned_before_it_watches_ends_too():
    with _owner_and_child("late") as (owner, child):
        assert owner.stdout.readline().strip() == "waiting"
        owner.kill()
        owner.wait(timeout=10)
        if owner.stdout.readline().strip() != "1":
            pytest.skip("orphans go to a subreaper here, not to init")
        assert _gone(child, 5.0)


def test_the_owner_itself_and_a_process_with_no_owner_watch_nothing(monkeypatch):
    monkeypatch.setenv(OWNER_ENV, str(os.getpid()))
    assert watch_owner() is False
    monkeypatch.delenv(OWNER_ENV)
    assert watch_owner() is False


@pytest.mark.slow
def test_a_killed_vllm_owner_leaves_no_engine_process(trained_target_dir):
    """vLLM runs the watch (a plugin of the project's) in the engine core and its worker."""
    script = textwrap.dedent(
        f"""
        import time
        from pipeline.targets.config import TargetConfig
        from pipeline.targets.loader import load_target
        if __name__ == "__main__":
            config = TargetConfig(
                model={str(trained_target_dir)!r}, backend="vllm", dtype="float32",
                max_model_len=512, gpu_memory_utilization=0.05,
            )
            target = load_target(config, capture=False)
            print("ready", flush=True)
            time.sleep(600)
        """
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    engine: list[psutil.Process] = []
    try:
        for line in owner.stdout:  # vLLM logs to stdout too
            if line.strip() == "ready":
                break
        engine = psutil.Process(owner.pid).children(recursive=True)
        assert any(
            "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name() for p in engine
        )
        owner.kill()
        owner.wait(timeout=10)
        assert all(_gone(p.pid, 60.0) for p in engine), [p.pid for p in engine]
    finally:
        owner.kill()
        for process in engine:
            if psutil.pid_exists(process.pid):
                process.kill()
