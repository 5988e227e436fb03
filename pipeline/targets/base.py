"""The interface every target backend implements, and the records it exchanges.

Backends (vLLM for production, transformers for reference) take token-id
prompts keyed by the project's own request ids (sample ids), never by
engine-local counters, so results from many replicas can be merged safely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

from pipeline.targets.config import GenerationConfig


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str  # the project's sample id: unique across replicas and runs
    prompt_ids: list[int]
    # Overrides GenerationConfig.max_new_tokens (e.g. to fit max_model_len).
    max_new_tokens: int | None = None


@dataclass(frozen=True)
class Generation:
    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]  # generated tokens, including the end-of-turn token when emitted
    finish_reason: str  # "stop" (end-of-turn) or "length"


@dataclass(frozen=True)
class CapturedGeneration:
    """A generation plus the target's hidden states over prompt + answer, from one pass.

    T = len(prompt_ids) + len(output_ids). Row t holds the states computed when
    token t was fed to the target. The final token is sampled but never fed, so
    its row is zero in both backends (no training target uses it: it predicts
    the token after the end of the answer).
    """

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    # (T, k*H), model dtype: the residual streams at the k aux ids (ascending),
    # concatenated along channels; aux id a = the stream after a decoder layers
    # (= HF output_hidden_states[a] for a < L).
    hidden_states: torch.Tensor
    # (T, H): the final hidden state after the target's final norm (its lm_head input).
    last_hidden_state: torch.Tensor


class TargetBackend(Protocol):
    """A loaded target that answers batches of prompts."""

    def generate(
        self, requests: Sequence[GenerationRequest], params: GenerationConfig
    ) -> list[Generation]:
        """Answer every request; results come back in request order."""
        ...

    def close(self) -> None:
        """Release the engine's memory and processes."""
        ...


class CapturingBackend(TargetBackend, Protocol):
    """A target backend that also captures hidden states while it generates."""

    aux_layer_ids: tuple[int, ...]  # ascending
    hidden_size: int

    def generate_and_capture(
        self, requests: Sequence[GenerationRequest], params: GenerationConfig
    ) -> list[CapturedGeneration]:
        """Answer every request and return its hidden states; results in request order."""
        ...


def request_seed(base_seed: int, request_id: str) -> int:
    """Per-request sampling seed: depends on the sample, not on batching or replica."""
    import hashlib

    digest = hashlib.sha256(f"{base_seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
