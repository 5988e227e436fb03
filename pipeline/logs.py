"""Quiet, structured logging: `key=value` pairs on one line per event.

Third-party loggers (vLLM, Ray, transformers, the S3 client) are turned down to
WARNING unless `--verbose` is given, so a long job's log shows the pipeline's
own events; a few lines every normal run prints that tell an operator nothing
(`QUIET_LINES`) are dropped. vLLM's warnings of preemption, memory and
restarted workers are never among them.
"""

from __future__ import annotations

import logging
import os

_NOISY = (
    "vllm",
    "ray",
    "transformers",
    "datasets",
    "urllib3",
    "botocore",
    "aiobotocore",  # "Found credentials in environment variables." at every start
    "s3fs",
    "filelock",
    # Ray resets its own "ray" logger to INFO when imported; its children keep these.
    "ray._private.worker",  # "Started a local Ray instance. View the dashboard at ..."
    "ray._private.services",
)
# Loggers whose WARNINGs are routine here: matplotlib's font cache ("building the
# font cache", missing font families) when the evaluation draws its plots.
_ERRORS_ONLY = ("matplotlib",)
# (logger, start of a message) a normal run prints that asks nothing of an operator:
# Ray's notice, at every local `ray.init`, that token authentication is off (or on)
# for the cluster it starts on this machine.
QUIET_LINES = (
    ("ray._private.authentication.authentication_token_setup", "Token authentication is"),
)


class _DropLines(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


def setup_logging(verbose: bool = False) -> None:
    from pipeline.redact import CREDENTIAL_LOGGERS, SecretFilter

    level = logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(SecretFilter())
    if verbose:  # also after a quiet setup (`-v` given after the command)
        for name in (*_NOISY, *_ERRORS_ONLY):
            logging.getLogger(name).setLevel(logging.NOTSET)
        for name, _ in QUIET_LINES:
            quiet = logging.getLogger(name)
            for f in [f for f in quiet.filters if isinstance(f, _DropLines)]:
                quiet.removeFilter(f)
    else:
        import warnings

        for name in _NOISY:
            logging.getLogger(name).setLevel(logging.WARNING)
        for name in _ERRORS_ONLY:
            logging.getLogger(name).setLevel(logging.ERROR)
        for name, prefix in QUIET_LINES:
            quiet = logging.getLogger(name)
            if not any(isinstance(f, _DropLines) for f in quiet.filters):
                quiet.addFilter(_DropLines((prefix,)))
        # vLLM's CPU build warns at every start (Triton, oneDNN, deprecated torch APIs).
        logging.getLogger("vllm").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", category=FutureWarning)
        # vLLM's CPU build warns at every start about Triton and oneDNN fallbacks.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    # Last, so neither branch above undoes it: their DEBUG records carry signed request
    # headers (access key id, session token), so they never go below INFO, verbose or not.
    for name in CREDENTIAL_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.getLogger(name).level, logging.INFO))


def kv(**fields: object) -> str:
    """Format fields as `k=v` pairs; strings with spaces are quoted."""
    parts = []
    for key, value in fields.items():
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        if " " in text:
            text = repr(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


# Lines vLLM, torch and Triton print at every engine start on a CPU host that
# tell an operator nothing; warnings that matter (KV-cache preemption, out of
# memory, a restarted worker) are not among them and always pass.
STARTUP_NOISE = (
    "Triton is installed, but doesn't include CPU backend",
    "NUMA binding: Using MEMBIND policy",
    "Loading safetensors checkpoint shards",
)


def quiet_engine_output(noise: tuple[str, ...] = STARTUP_NOISE) -> None:
    """Drop start-up noise from this process's stdout/stderr and its children's.

    For a process about to start a vLLM engine (the replica actor): vLLM's
    engine process inherits the file descriptors, so its lines pass a filter
    thread here on their way to Ray's log files and the driver's terminal.
    Python warnings of deprecated torch APIs are silenced for the children
    through `PYTHONWARNINGS`, and torch's C++ notices through
    `TORCH_CPP_LOG_LEVEL`. Idempotent.
    """
    import sys

    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore::DeprecationWarning")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    global _FILTERING
    if _FILTERING:
        return
    _FILTERING = True
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    for fd in (1, 2):
        _filter_fd(fd, tuple(n.encode() for n in noise))


_FILTERING = False


def _filter_fd(fd: int, noise: tuple[bytes, ...]) -> None:
    import select
    import threading

    read_end, write_end = os.pipe()
    target = os.dup(fd)
    os.dup2(write_end, fd)
    os.close(write_end)

    def pump() -> None:
        pending = b""
        dropped = False  # a progress bar's blank closing line goes with it
        while True:
            ready, _, _ = select.select([read_end], [], [], 0.2)
            chunk = os.read(read_end, 1 << 16) if ready else b""
            if ready and not chunk:  # every writer closed
                if pending:
                    os.write(target, pending)
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = []
            for line in lines:
                if any(n in line for n in noise) or (dropped and not line.strip(b"\r\t ")):
                    dropped = True
                    continue
                dropped = False
                kept.append(line + b"\n")
            out = b"".join(kept)
            # A partial line (a progress bar) goes out once nothing more came for a while.
            if pending and not ready and not any(n in pending for n in noise):
                out, pending = out + pending, b""
            if out:
                os.write(target, out)

    threading.Thread(target=pump, name=f"output-filter-{fd}", daemon=True).start()
