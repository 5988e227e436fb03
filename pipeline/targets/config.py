"""Typed configs of the target: which model, how the engine runs it, how it samples."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from pipeline.config import ConfigModel


class TargetConfig(ConfigModel):
    """The target model whose answers and hidden states become training targets."""

    # A Hugging Face hub name, a local model directory, or a built-in toy target
    # (`toy:trained`, `toy:random`, `toy:large`) that is built and cached on first use.
    model: str
    # Hub revision (branch, tag or commit); recorded in provenance.
    revision: str | None = None
    # Which backend runs the target: vLLM (production) or transformers (reference).
    backend: Literal["vllm", "hf"] = "vllm"
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    max_model_len: int = Field(4096, gt=0)
    # Parallelism inside one replica.
    tensor_parallel_size: int = Field(1, ge=1)
    enable_expert_parallel: bool = False
    # On CPU vLLM reserves this share of RAM for the KV cache (0.2-0.3 on 24 GB).
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    enforce_eager: bool = False
    # Passed through to `vllm.LLM(...)` verbatim, for settings this schema lacks.
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    # How a capture engine takes hidden states out of vLLM (docs/capture.md):
    # `aux_outputs`: the target's forward returns them (vLLM's aux-hidden-state
    # interface) to the project's worker, no speculative decoding; or
    # `extract_hidden_states`: vLLM's speculative method plus the project's KV
    # connector (one extra scheduled position per request per step).
    capture_method: Literal["aux_outputs", "extract_hidden_states"] = "aux_outputs"
    # Residual streams to capture, as aux ids (stream after k decoder layers;
    # docs/design.md#the-layer-convention). None: the DFlash spacing for the target's depth. The final
    # hidden state (after the final norm) is always captured as well.
    aux_layer_ids: list[int] | None = None

    @field_validator("aux_layer_ids")
    @classmethod
    def _sorted_unique(cls, value: list[int] | None) -> list[int] | None:
        if value is not None:
            if not value or any(v < 0 for v in value) or sorted(set(value)) != value:
                raise ValueError("must be a non-empty ascending list of distinct non-negative ints")
        return value

    @field_validator("model")
    @classmethod
    def _known_model_ref(cls, value: str) -> str:
        from pipeline.targets.resolve import check_model_ref

        check_model_ref(value)
        return value


class GenerationConfig(ConfigModel):
    """Sampling parameters for regenerating assistant turns."""

    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    max_new_tokens: int = Field(2048, gt=0)
    # Seeds per sample derive from this and the sample id, so reruns agree.
    seed: int = 0
