"""vLLM backend: the production implementation of `TargetBackend`.

One instance owns one engine (one target replica). Prompts go in as token ids
(the project renders chat templates itself, so the token ids that are stored
are exactly the ones the engine saw) and results come back keyed by the
project's request ids, never by vLLM's per-engine counters.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pipeline.config import GenerationConfig, TargetConfig
from pipeline.logs import kv
from pipeline.targets.base import Generation, GenerationRequest, request_seed

log = logging.getLogger(__name__)


def engine_kwargs(config: TargetConfig, model_dir: str) -> dict[str, Any]:
    """Arguments for `vllm.LLM` from a TargetConfig (engine_kwargs override the rest)."""
    kwargs: dict[str, Any] = {
        "model": model_dir,
        "revision": config.revision,
        "dtype": config.dtype,
        "max_model_len": config.max_model_len,
        "tensor_parallel_size": config.tensor_parallel_size,
        "enable_expert_parallel": config.enable_expert_parallel,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "enforce_eager": config.enforce_eager,
        # Generation defaults come from our config, not the checkpoint's file.
        "generation_config": "vllm",
        "seed": 0,
    }
    kwargs.update(config.engine_kwargs)
    return kwargs


class VLLMTarget:
    def __init__(self, config: TargetConfig, model_dir: str) -> None:
        from vllm import LLM

        self.config = config
        kwargs = engine_kwargs(config, model_dir)
        log.info("starting vLLM engine %s", kv(model=model_dir, dtype=config.dtype))
        self.llm = LLM(**kwargs)
        self.eos_id = self.llm.get_tokenizer().eos_token_id

    def sampling_params(self, request: GenerationRequest, params: GenerationConfig):
        from vllm import SamplingParams

        return SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=request.max_new_tokens or params.max_new_tokens,
            seed=request_seed(params.seed, request.request_id),
            stop_token_ids=[self.eos_id],
            # Keep the end-of-turn token: the draft learns to predict it too.
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            detokenize=False,
        )

    def generate(
        self, requests: Sequence[GenerationRequest], params: GenerationConfig
    ) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        sampling = [self.sampling_params(r, params) for r in requests]
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
        results = []
        for request, out in zip(requests, outputs, strict=True):
            completion = out.outputs[0]
            results.append(
                Generation(
                    request_id=request.request_id,
                    prompt_ids=list(request.prompt_ids),
                    output_ids=list(completion.token_ids),
                    finish_reason="stop" if completion.finish_reason == "stop" else "length",
                )
            )
        return results

    def close(self) -> None:
        import gc

        del self.llm
        gc.collect()
