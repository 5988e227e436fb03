"""Replica output filter: start-up noise dropped, for the process and its children; the rest kept."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_startup_noise_is_dropped_and_warnings_that_matter_pass():
    script = textwrap.dedent(
        """
        import subprocess, sys, time
        from pipeline.logs import quiet_engine_output
        quiet_engine_output()
        print("Triton is installed, but doesn't include CPU backend. Disabling Triton.", flush=True)
        print("WARNING scheduler: request 7 preempted (KV cache full)", flush=True)
        sys.stderr.write("Loading safetensors checkpoint shards: 100% 1/1\\r\\n\\n")
        sys.stderr.flush()
        subprocess.run([sys.executable, "-c",
            "import sys; sys.stderr.write('[W] Warning: NUMA binding: Using MEMBIND policy\\\\n'); "
            "print('child: out of memory in worker 3', flush=True)"])
        time.sleep(0.5)  # let the filter threads forward what they hold
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    out = done.stdout + done.stderr
    assert "preempted (KV cache full)" in out and "child: out of memory in worker 3" in out
    for noise in ("Triton is installed", "Loading safetensors", "NUMA binding"):
        assert noise not in out
    assert "\n\n" not in done.stderr  # the progress bar's blank closing line went with it
