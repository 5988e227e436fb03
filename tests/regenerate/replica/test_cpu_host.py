"""Host work moves off the CPUs a model worker bound itself to (real processes, real masks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from pipeline.regenerate.replica.cpu_host import descendants, worker_cpus

CPUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 CPUs to bind one apart")

# A child that binds itself to one CPU (as vLLM's CPU worker binds its OpenMP
# threads) and whose command line names a worker; and a plain child.
CHILD = "import os, sys, time; os.sched_setaffinity(0, {int(sys.argv[1])}); time.sleep(60)"
PLAIN = "import time; time.sleep(60)"


def _spawn(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args])


def test_descendants_lists_children_and_grandchildren():
    parent = _spawn(
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', {PLAIN!r}]); time.sleep(60)"
    )
    try:
        for _ in range(100):
            found = descendants(parent.pid)
            if found:
                break
            __import__("time").sleep(0.05)
        assert len(found) == 1 and found[0] != parent.pid
        assert parent.pid in descendants(os.getpid())
    finally:
        for pid in descendants(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


@needs_two
def test_only_workers_count_and_only_narrowed_masks():
    worker = _spawn(CHILD, str(CPUS[-1]), "VLLM::Worker")
    plain = _spawn(CHILD, str(CPUS[0]))  # bound too, but not a worker
    try:
        __import__("time").sleep(0.5)
        assert worker_cpus([worker.pid, plain.pid], set(CPUS)) == {CPUS[-1]}
        assert worker_cpus([plain.pid], set(CPUS)) == set()
    finally:
        for p in (worker, plain):
            p.kill()
            p.wait()


@needs_two
def test_isolate_moves_this_thread_and_the_engine_core_but_not_the_worker():
    script = textwrap.dedent(
        f"""
        import json, os, subprocess, sys, time
        from pipeline.regenerate.replica.cpu_host import isolate_host_work
        worker = subprocess.Popen([sys.executable, "-c", {CHILD!r}, "{CPUS[-1]}", "VLLM::Worker"])
        core = subprocess.Popen([sys.executable, "-c", {PLAIN!r}])
        time.sleep(0.5)
        host = isolate_host_work()
        out = dict(
            host=sorted(host) if host else None,
            me=sorted(os.sched_getaffinity(0)),
            core=sorted(os.sched_getaffinity(core.pid)),
            worker=sorted(os.sched_getaffinity(worker.pid)),
        )
        worker.kill(); core.kill()
        print(json.dumps(out))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    rest = [c for c in CPUS if c != CPUS[-1]]
    assert got == {"host": rest, "me": rest, "core": rest, "worker": [CPUS[-1]]}


@needs_two
def test_the_engine_core_can_share_the_workers_cpus():
    script = textwrap.dedent(
        f"""
        import json, os, subprocess, sys, time
        from pipeline.regenerate.replica.cpu_host import isolate_host_work
        worker = subprocess.Popen([sys.executable, "-c", {CHILD!r}, "{CPUS[-1]}", "VLLM::Worker"])
        core = subprocess.Popen([sys.executable, "-c", {PLAIN!r}, "VLLM::EngineCore"])
        other = subprocess.Popen([sys.executable, "-c", {PLAIN!r}])
        time.sleep(0.5)
        host = isolate_host_work(engine_core_on_workers=True)
        out = dict(
            host=sorted(host) if host else None,
            me=sorted(os.sched_getaffinity(0)),
            core=sorted(os.sched_getaffinity(core.pid)),
            other=sorted(os.sched_getaffinity(other.pid)),
            worker=sorted(os.sched_getaffinity(worker.pid)),
        )
        worker.kill(); core.kill(); other.kill()
        print(json.dumps(out))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    rest = [c for c in CPUS if c != CPUS[-1]]
    assert got == {
        "host": rest,
        "me": rest,
        "core": [CPUS[-1]],
        "other": rest,
        "worker": [CPUS[-1]],
    }


def test_nothing_moves_without_a_bound_worker():
    script = (
        "import os, subprocess, sys, time\n"
        "from pipeline.regenerate.replica.cpu_host import isolate_host_work\n"
        f"core = subprocess.Popen([sys.executable, '-c', {PLAIN!r}])\n"
        "time.sleep(0.3)\n"
        "print(isolate_host_work(), sorted(os.sched_getaffinity(0)))\n"
        "core.kill()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(None, 1) == ["None", f"{CPUS}\n"]
