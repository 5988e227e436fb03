"""The interface every target backend implements, and the records it exchanges.

Backends (vLLM for production, transformers for reference) take token-id
prompts keyed by the project's own request ids (sample ids), never by
engine-local counters, so results from many replicas can be merged safely.
"""

from __future__ import annotations

import dataclasses
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
class CapturedStates:
    """A request's hidden states over prompt + answer, from one pass.

    T = len(prompt_ids) + len(output_ids). Row t holds the states computed when
    token t was fed to the target. The final token is sampled but never fed, so
    its row is zero in both backends (no training target uses it: it predicts
    the token after the end of the answer).
    """

    # (T, k*H), model dtype: the residual streams at the k aux ids (ascending),
    # concatenated along channels; aux id a = the stream after a decoder layers
    # (= HF output_hidden_states[a] for a < L).
    hidden_states: torch.Tensor
    # (T, H): the final hidden state after the target's final norm (its lm_head input).
    last_hidden_state: torch.Tensor


class CapturedRows(Protocol):
    """A finished request's captured rows, wherever they are held: one interface.

    Built tensors (`HeldRows`), an engine's row pieces in this process, or rows
    left in the engine's spool for another process (`targets/capture_rows.py`).
    `states()` builds the tensors (RuntimeError: positions never written); the
    caller runs it off the engine's thread. A handle is picklable, so a
    write-back process can build it.
    """

    nbytes: int  # host memory the rows hold until built (what admission reserved)

    def states(self) -> CapturedStates: ...

    def release(self) -> None:
        """Drop rows nobody will build (a failed or empty answer); in the process that
        reads them (the spool's reader)."""
        ...


@dataclass(frozen=True)
class HeldRows:
    """Rows already built: what the transformers reference returns, and `run_all`."""

    built: CapturedStates

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in vars(self.built).values())

    def states(self) -> CapturedStates:
        return self.built

    def release(self) -> None:
        pass


@dataclass(frozen=True)
class Generation:
    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]  # generated tokens, including the end-of-turn token when emitted
    finish_reason: str  # "stop" (end-of-turn) or "length"
    rows: CapturedRows | None = None  # the captured rows of a request submitted with capture


@dataclass(frozen=True)
class RequestFailure:
    """A request the backend could not complete (e.g. its capture was incomplete)."""

    request_id: str
    reason: str  # stable short code, e.g. "capture_incomplete"
    detail: str
    rows: CapturedRows | None = None  # rows it left where only their reader can drop them


Result = Generation | RequestFailure


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

    def poll(self) -> list[Result]:
        """Advance the engine; the requests that finished (any order), a captured one with
        its rows handle (not built: whoever builds it does so off the engine's thread)."""
        ...

    def hand_off_rows(self, enabled: bool = True) -> object | None:
        """Leave captured rows in the engine's spool from now on, for a reader in another
        process (the write-back's); the contract it needs (a picklable
        `capture_rows.CaptureContract`, named here only in words: that module builds on
        this one), or None where rows cannot cross processes (then nothing changes).
        `enabled=False` takes them back."""
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
    ) -> list[Generation]:
        """Answer every request with its hidden states built (`rows` is a `HeldRows`);
        results in request order."""
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
    backends, on top of their streaming interface. A failed request raises;
    captured rows come back built.
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
    return [_built(done[i]) for i in ids]


def _built(gen: Generation) -> Generation:
    if gen.rows is None:
        return gen
    return dataclasses.replace(gen, rows=HeldRows(gen.rows.states()))
