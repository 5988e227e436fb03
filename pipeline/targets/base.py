"""The interface every target backend implements, and the records it exchanges.

Backends (vLLM for production, transformers for reference) take token-id
prompts keyed by the project's own request ids (sample ids), never by
engine-local counters, so results from many replicas can be merged safely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


@dataclass(frozen=True)
class PendingCapture:
    """A finished request whose captured tensors are not built yet.

    What a streaming backend returns from `poll(defer=True)`: the tokens are
    final, and `materialize()` assembles the rows, applies the final norm and
    returns the `CapturedGeneration` (raising RuntimeError if positions are
    missing). The caller runs it off the engine's thread (the write-back's
    workers), so the engine loop only moves references.
    """

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    materialize: Callable[[], CapturedGeneration]


@dataclass(frozen=True)
class SpooledCapture:
    """A finished request whose captured rows stay in the engine's spool.

    What a backend returns once its rows were handed off
    (`VLLMTarget.hand_off_rows`): the tokens are final, and whoever holds the
    capture contract reads the rows and builds the tensors
    (`capture_rows.SpoolRows`), in another process if it likes.
    """

    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str


@dataclass(frozen=True)
class RequestFailure:
    """A request the backend could not complete (e.g. its capture was incomplete)."""

    request_id: str
    reason: str  # stable short code, e.g. "capture_incomplete"
    detail: str


Result = Generation | CapturedGeneration | PendingCapture | SpooledCapture | RequestFailure


class StreamingBackend(Protocol):
    """A target that takes requests one at a time and hands back each as it finishes.

    What keeps an engine full: the caller submits while earlier requests run
    and reacts to every finished one (a multi-turn conversation's next turn
    goes in at once). `poll` advances the engine by one step.
    """

    aux_layer_ids: tuple[int, ...]  # ascending
    hidden_size: int
    max_concurrency: int  # requests the engine runs at once (vLLM's max_num_seqs)
    capture_bytes_per_token: int  # host memory a captured request holds per token

    def submit(
        self, request: GenerationRequest, params: GenerationConfig, *, capture: bool = True
    ) -> None:
        """Queue a request; with `capture` its hidden states come back with it."""
        ...

    def poll(self, *, defer: bool = False) -> list[Result]:
        """Advance the engine; the requests that finished (any order).

        `defer=True` may return `PendingCapture`s instead of built captures; a
        backend whose rows were handed off returns `SpooledCapture`s.
        """
        ...

    def num_unfinished(self) -> int: ...

    def close(self) -> None: ...


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


class CapturingBackend(TargetBackend, StreamingBackend, Protocol):
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


def run_all(
    backend: StreamingBackend,
    requests: Sequence[GenerationRequest],
    params: GenerationConfig,
    *,
    capture: bool,
) -> list[Result]:
    """Submit every request, poll until all finished; results in request order.

    The batch entry points (`generate`, `generate_and_capture`) of both
    backends, on top of their streaming interface. A failed request raises.
    """
    ids = [r.request_id for r in requests]
    if len(set(ids)) != len(ids):
        raise ValueError("request ids must be unique within a batch (they key the results)")
    for request in requests:
        backend.submit(request, params, capture=capture)
    done: dict[str, Result] = {}
    while backend.num_unfinished():
        for result in backend.poll():
            done[result.request_id] = result
    for result in done.values():
        if isinstance(result, RequestFailure):
            raise RuntimeError(f"{result.request_id!r}: {result.reason}: {result.detail}")
    return [done[i] for i in ids]
