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


def test_a_normal_run_drops_routine_third_party_lines_and_keeps_what_matters():
    script = textwrap.dedent(
        """
        import logging, sys
        from pipeline.logs import setup_logging
        setup_logging(verbose="-v" in sys.argv)
        auth = "ray._private.authentication.authentication_token_setup"
        logging.getLogger(auth).warning("Token authentication is disabled for this Ray cluster.")
        logging.getLogger("matplotlib.font_manager").warning("Matplotlib is building the font cache")
        logging.getLogger("aiobotocore.credentials").info("Found credentials in environment variables.")
        logging.getLogger("ray").warning("ray: a worker died unexpectedly")
        logging.getLogger("vllm.engine").error("EngineCore out of memory")
        logging.getLogger("pipeline.regenerate").warning("unit 3 retried")
        """
    )
    quiet = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stderr
    for routine in ("Token authentication", "font cache", "Found credentials"):
        assert routine not in quiet
    for kept in ("a worker died", "out of memory", "unit 3 retried"):
        assert kept in quiet
    loud = subprocess.run(
        [sys.executable, "-c", script, "-v"], capture_output=True, text=True, timeout=60, check=True
    ).stderr
    assert "Token authentication" in loud and "font cache" in loud
