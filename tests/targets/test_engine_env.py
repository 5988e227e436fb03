"""Engine environment defaults: set on a CPU host, never over a user's value, and carried
into the engine processes the project launches."""

from __future__ import annotations

import os

from vllm.platforms import current_platform

from pipeline.evaluate.config import ServingConfig
from pipeline.evaluate.server import BASELINE, Engine, server_command
from pipeline.targets.engine_env import apply_engine_env, engine_env, launch_env
from pipeline.targets.engine_owner import OWNER_ENV

AOT = "VLLM_USE_AOT_COMPILE"


def test_a_cpu_host_turns_vllms_aot_artifact_off_and_a_gpu_host_keeps_the_default():
    assert engine_env() == ({AOT: "0"} if current_platform.is_cpu() else {})


def test_defaults_apply_only_where_the_user_set_nothing(monkeypatch):
    monkeypatch.delenv(AOT, raising=False)
    apply_engine_env()
    assert os.environ.get(AOT) == engine_env().get(AOT)

    monkeypatch.setenv(AOT, "1")
    apply_engine_env()
    assert os.environ[AOT] == "1"


def test_a_launched_server_gets_the_defaults_beneath_the_users_environment(monkeypatch):
    monkeypatch.delenv(AOT, raising=False)
    _, env = server_command("t", Engine(BASELINE), ServingConfig(), port=1, memory=None)
    assert env.get(AOT) == engine_env().get(AOT)

    monkeypatch.setenv(AOT, "1")
    monkeypatch.setenv(OWNER_ENV, "1")  # inherited from a process above: this one owns it
    _, env = server_command("t", Engine(BASELINE), ServingConfig(), port=1, memory=None)
    assert env[AOT] == "1"
    assert env[OWNER_ENV] == str(os.getpid())


def test_a_launched_engine_logs_at_warning_unless_the_user_says_otherwise(monkeypatch):
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    assert launch_env()["VLLM_LOGGING_LEVEL"] == "WARNING"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    assert launch_env()["VLLM_LOGGING_LEVEL"] == "DEBUG"
