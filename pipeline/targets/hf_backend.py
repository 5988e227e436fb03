"""Hugging Face transformers backend: the reference implementation of `TargetBackend`.

Slow (one sequence at a time, no paged KV cache) and exact: tests compare the
vLLM backend against it token for token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from pipeline.targets.base import (
    CapturedStates,
    Generation,
    GenerationRequest,
    HeldRows,
    Result,
    request_seed,
    run_all,
)
from pipeline.targets.config import GenerationConfig, TargetConfig
from pipeline.targets.resolve import shape_of


class HFTarget:
    def __init__(self, config: TargetConfig, model_dir: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, revision=config.revision)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, revision=config.revision, dtype=getattr(torch, config.dtype)
        ).eval()
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        text = getattr(self.model.config, "text_config", self.model.config)
        shape = shape_of(text.num_hidden_layers, text.hidden_size, config.aux_layer_ids, model_dir)
        self.aux_layer_ids, self.hidden_size = shape.aux_layer_ids, shape.hidden_size
        # Host memory a request's captured rows take per token (k aux streams + the final one).
        self.capture_bytes_per_token = (
            (len(self.aux_layer_ids) + 1) * self.hidden_size * getattr(torch, config.dtype).itemsize
        )
        self._queue: deque[tuple[GenerationRequest, GenerationConfig, bool]] = deque()

    # One sequence at a time: the streaming interface runs one request per poll.
    max_concurrency = 1

    def submit(
        self, request: GenerationRequest, params: GenerationConfig, *, capture: bool = True
    ) -> None:
        self._queue.append((request, params, capture))

    def num_unfinished(self) -> int:
        return len(self._queue)

    def hand_off_rows(self, enabled: bool = True) -> None:
        """Rows are built here, in this process: there is no spool to hand off."""
        return None

    def poll(self) -> list[Result]:
        if not self._queue:
            return []
        request, params, capture = self._queue.popleft()
        gen = self._generate_one(request, params)
        return [self.capture(gen) if capture else gen]

    def generate(
        self, requests: Sequence[GenerationRequest], params: GenerationConfig
    ) -> list[Generation]:
        return run_all(self, requests, params, capture=False)

    def _generate_one(self, request: GenerationRequest, params: GenerationConfig) -> Generation:
        """Sample one answer token by token with a KV cache (greedy at temperature 0)."""
        import torch

        limit = request.max_new_tokens or params.max_new_tokens
        generator = torch.Generator().manual_seed(request_seed(params.seed, request.request_id))
        step_input = torch.tensor([request.prompt_ids])
        past = None
        output: list[int] = []
        finish = "length"
        with torch.no_grad():
            for _ in range(limit):
                out = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = _sample(out.logits[0, -1].float(), params, generator)
                output.append(token)
                if token in self.eos_ids:
                    finish = "stop"
                    break
                step_input = torch.tensor([[token]])
        return Generation(request.request_id, list(request.prompt_ids), output, finish)

    def generate_and_capture(
        self, requests: Sequence[GenerationRequest], params: GenerationConfig
    ) -> list[Generation]:
        """Generate, then one forward pass over prompt + answer for the hidden states.

        The reference does two passes on purpose: it is the independent
        ground truth the single-pass vLLM capture is compared against.
        """
        return run_all(self, requests, params, capture=True)

    def capture(self, gen: Generation) -> Generation:
        """`gen` with the hidden states of its prompt + answer; the final (never fed) row is zero."""
        import torch

        ids = gen.prompt_ids + gen.output_ids
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids[:-1]]), output_hidden_states=True)
        hs = out.hidden_states  # L + 1 tensors (1, T-1, H); hs[L] is after the final norm
        zero = torch.zeros(1, self.hidden_size, dtype=hs[0].dtype)
        hidden = torch.cat([torch.cat([hs[a][0], zero]) for a in self.aux_layer_ids], dim=-1)
        last = torch.cat([hs[-1][0], zero])
        rows = HeldRows(CapturedStates(hidden, last))
        return Generation(gen.request_id, gen.prompt_ids, gen.output_ids, gen.finish_reason, rows)

    def close(self) -> None:
        del self.model


def _sample(logits, params: GenerationConfig, generator) -> int:
    import torch

    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(sorted_probs, 0) - sorted_probs < params.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=generator))
