"""Environment defaults for the vLLM engines the project starts, each with its reason.

`VLLM_USE_AOT_COMPILE=0` on CPU. With the pinned stack (constraints.txt: vLLM
0.32, torch 2.13 CPU), vLLM's CPU platform compiles without Inductor, and the
ahead-of-time artifact it saves never loads back ("Compiling model again due
to a load failure ... 'function' object has no attribute 'finalize_loading'"):
every engine start traced the model again and paid for saving the artifact
too. vLLM's standard compile cache loads. A toy engine's start, measured back
to back on one host: 22 s instead of 28 s with a warm cache, 35 s instead of
43 s on a cold one (bench/RESULTS.md). On a GPU (Inductor on) vLLM's default
stays.

A value the user set always wins. In-process engines take the defaults from
`apply_engine_env()` before they start (their engine-core and worker processes
inherit them); launchers of engine processes start them with `launch_env()`.
Both also name this process the engines' owner: they end when it dies
(pipeline/targets/engine_owner.py).
"""

from __future__ import annotations

import os

from pipeline.targets.engine_owner import owner_env


def engine_env() -> dict[str, str]:
    """The defaults for this host's engines (user values not applied: see the module)."""
    from vllm.platforms import current_platform

    return {"VLLM_USE_AOT_COMPILE": "0"} if current_platform.is_cpu() else {}


def apply_engine_env() -> None:
    """Set `engine_env()`'s defaults in this process where the user has not set them,
    and name this process the owner of the engines it starts (engine_owner.py)."""
    for key, value in engine_env().items():
        os.environ.setdefault(key, value)
    os.environ.update(owner_env())


def launch_env() -> dict[str, str]:
    """The environment for an engine process this process launches: `engine_env()` and
    vLLM's logging at WARNING, each beneath this process's environment; this process
    its owner (the launched process ends when this one dies: engine_owner.py)."""
    return {**engine_env(), "VLLM_LOGGING_LEVEL": "WARNING", **os.environ, **owner_env()}
