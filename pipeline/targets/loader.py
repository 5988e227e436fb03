"""Build the configured target backend on the resolved model (vLLM or transformers)."""

from __future__ import annotations

from pipeline.targets.base import TargetBackend
from pipeline.targets.config import TargetConfig
from pipeline.targets.resolve import resolve_model


def load_target(config: TargetConfig, capture: bool = False) -> TargetBackend:
    """Build the configured backend on the resolved model.

    `capture=True` returns a `CapturingBackend`: for vLLM an engine with the
    hidden-state capture method (dearer per step than a plain engine, so only
    when asked); the transformers reference always captures.
    """
    model_dir = resolve_model(config.model)
    if config.backend == "vllm":
        from pipeline.targets.vllm_backend import VLLMTarget

        return VLLMTarget(config, model_dir, capture=capture)
    from pipeline.targets.hf_backend import HFTarget

    return HFTarget(config, model_dir)
