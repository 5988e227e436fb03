"""The interface every target backend implements, and the records it exchanges.

Backends (vLLM for production, transformers for reference) take token-id
prompts keyed by the project's own request ids (sample ids), never by
engine-local counters, so results from many replicas can be merged safely.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.config import GenerationConfig


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


def request_seed(base_seed: int, request_id: str) -> int:
    """Per-request sampling seed: depends on the sample, not on batching or replica."""
    import hashlib

    digest = hashlib.sha256(f"{base_seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF
