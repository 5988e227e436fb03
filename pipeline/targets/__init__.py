"""Target backends behind one interface (`TargetBackend`), and the toy targets."""

from __future__ import annotations

from pipeline.config import TargetConfig
from pipeline.targets.base import TargetBackend


def load_target(config: TargetConfig, capture: bool = False) -> TargetBackend:
    """Build the configured backend; `toy:*` models are built or fetched from cache first.

    `capture=True` returns a `CapturingBackend`: for vLLM an engine with the
    hidden-state capture method (dearer per step than a plain engine, so only
    when asked); the transformers reference always captures.
    """
    from pipeline.targets.toy import resolve_model

    model_dir = resolve_model(config.model)
    if config.backend == "vllm":
        from pipeline.targets.vllm_backend import VLLMTarget

        return VLLMTarget(config, model_dir, capture=capture)
    from pipeline.targets.hf_backend import HFTarget

    return HFTarget(config, model_dir)
