"""Owner side of vLLM hidden-state capture: engine arguments, reading the sink, assembly.

vLLM's `extract_hidden_states` speculative method writes the residual streams
of the requested aux layers into a paged cache; the project's connector
(`capture_connector.py`, loaded by vLLM inside its engine processes) copies
the rows each engine step wrote and hands them to a *sink* as one
`CaptureChunk` per step. This module is everything the owner of the engine
needs: the `vllm.LLM` arguments, the per-request opt-in, reading the sink,
assembling per-request tensors and the target's final norm. It imports no vLLM
(the connector imports it, not the other way round). See docs/capture.md.

The chunk and its spool file format are pipeline/targets/capture_chunks.py.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.targets.capture_chunks import CaptureChunk, read_spool

if TYPE_CHECKING:
    import torch

CONNECTOR_NAME = "HiddenStateCaptureConnector"
CONNECTOR_MODULE = "pipeline.targets.capture_connector"
TRANSPORTS = ("spool", "inprocess", "discard")
METHODS = ("aux_outputs", "extract_hidden_states")
WORKER_CLASS = "pipeline.targets.capture_worker.CaptureWorker"
WORKER_SETTINGS_KEY = "dspark_capture"  # VllmConfig.additional_config[...] for the worker
CAPTURE_ARG = "dspark_capture_key"  # SamplingParams.extra_args[...] of a capturing request


# --------------------------------------------------------------------------- engine arguments


def speculative_config(engine_aux_ids: list[int]) -> dict[str, Any]:
    """`vllm.LLM(speculative_config=...)` that captures `engine_aux_ids` (sorted, unique).

    Aux id k = the residual stream after k decoder layers (0 = embeddings,
    L = the last layer's output before the final norm). vLLM emits them in
    ascending order whatever the list order, hence the check.
    """
    ids = [int(i) for i in engine_aux_ids]
    if ids != sorted(set(ids)) or not ids or ids[0] < 0:
        raise ValueError(f"aux layer ids must be non-negative, sorted and unique: {ids}")
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,  # the proposer asserts exactly 1
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}},
    }


@dataclass(frozen=True)
class SinkSpec:
    """Where an engine's capture code hands its chunks, and where the owner reads them.

    `spool`: files in `capture_dir` (any process layout on one node);
    `inprocess`: a registry in this process, valid only when vLLM's worker
    runs in it (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, one worker); `discard`:
    profiling only.
    """

    transport: str
    capture_dir: str | None = None  # spool directory, or the inprocess channel name

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(
                f"unknown capture transport {self.transport!r}; choose one of {TRANSPORTS}"
            )
        if self.transport != "discard" and not self.capture_dir:
            raise ValueError(f"the {self.transport} transport needs capture_dir (dir or channel)")

    def extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {"capture_transport": self.transport}
        if self.transport == "spool":
            out["capture_dir"] = self.capture_dir
        elif self.transport == "inprocess":
            out["capture_channel"] = self.capture_dir
        return out


def kv_transfer_config(transport: str, capture_dir: str | None = None) -> dict[str, Any]:
    """`vllm.LLM(kv_transfer_config=...)` for the project's connector (`extract_hidden_states`)."""
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": SinkSpec(transport, capture_dir).extra(),
    }


def worker_engine_kwargs(sink: SinkSpec, engine_aux_ids: list[int]) -> dict[str, Any]:
    """`vllm.LLM(...)` arguments of the `aux_outputs` method (the capture worker, no spec decode)."""
    ids = [int(i) for i in engine_aux_ids]
    if ids != sorted(set(ids)) or not ids or ids[0] < 0:
        raise ValueError(f"aux layer ids must be non-negative, sorted and unique: {ids}")
    settings = {"aux_layer_ids": ids, "transport": sink.transport}
    settings.update({k: v for k, v in sink.extra().items() if k != "capture_transport"})
    return {
        "worker_cls": WORKER_CLASS,
        "additional_config": {WORKER_SETTINGS_KEY: settings},
    }


def capture_params(key: str, method: str = "extract_hidden_states") -> dict[str, Any]:
    """`SamplingParams.extra_args` that capture one request (prompt and output) under `key`."""
    if "\n" in str(key):
        raise ValueError(
            f"a capture key cannot hold a newline (the spool joins keys by it): {key!r}"
        )
    if method == "aux_outputs":
        return {CAPTURE_ARG: str(key)}
    return {"kv_transfer_params": {"capture_key": str(key), "include_output_tokens": True}}


# --------------------------------------------------------------------------- sinks


_INPROCESS: dict[str, list[CaptureChunk]] = defaultdict(list)
_INPROCESS_LOCK = threading.Lock()


def put_inprocess(channel: str, chunk: CaptureChunk) -> None:
    with _INPROCESS_LOCK:
        _INPROCESS[channel].append(chunk)


def take_inprocess(channel: str) -> list[CaptureChunk]:
    with _INPROCESS_LOCK:
        return _INPROCESS.pop(channel, [])


class CaptureReader:
    """The owner's view of one engine's sink."""

    def __init__(self, sink: SinkSpec) -> None:
        self.transport = sink.transport
        self.capture_dir = sink.capture_dir if sink.transport == "spool" else None
        self.channel = sink.capture_dir if sink.transport == "inprocess" else None

    def take_chunks(self) -> list[CaptureChunk]:
        if self.transport == "spool":
            chunks = read_spool(self.capture_dir)
        elif self.transport == "inprocess":
            chunks = take_inprocess(self.channel)
        else:
            chunks = []
        chunks.sort(key=lambda c: c.step)
        return chunks

    def collect(self) -> dict[str, torch.Tensor]:
        """Drain the sink: `{key: (num_positions, num_aux, H)}` for positions 0.. of each request.

        Call after `LLM.generate` returned: every row of a finished request is
        in the sink before its output is emitted (the connector copies inside
        the step). A later step overwrites an earlier one at the same position
        (a rejected draft row, a recomputation after preemption).
        """
        return assemble(self.take_chunks())


class CaptureAssembler:
    """Per-request rows built up from step-ordered chunks, taken out as requests finish.

    A streaming engine drains its sink whenever a request finishes; the pieces
    of requests still running stay here until theirs does. Add chunks in step
    order: a later step overwrites an earlier one at the same position (a
    rejected draft row, a recomputation after preemption).

    Pieces are numpy views of the chunk's rows (`row_bits`: the same bytes as
    integers), because a request gets one piece per engine step and slicing a
    numpy array costs far less than slicing a tensor (docs/capture.md, "Memory
    and writing"). `RowLayout.to_states` and `join_parts` take them as they are.
    """

    def __init__(self) -> None:
        self._pieces: dict[str, list[tuple[int, Any]]] = defaultdict(list)
        self.nbytes = 0  # bytes of rows held for requests not yet taken
        self.dtype: torch.dtype | None = None  # of the rows added so far

    def add(self, chunks: list[CaptureChunk]) -> None:
        for chunk in chunks:
            self.dtype = chunk.rows.dtype
            bits = row_bits(chunk.rows)
            row_bytes = bits[0].nbytes if len(bits) else 0
            offset = 0
            for key, start, length in zip(chunk.keys, chunk.starts, chunk.lengths, strict=True):
                self._pieces[key].append((start, bits[offset : offset + length]))
                offset += length
            self.nbytes += offset * row_bytes

    def keys(self) -> list[str]:
        return list(self._pieces)

    def reaches(self, key: str, end: int) -> bool:
        """Whether `key`'s pieces so far write a position at or past `end - 1`."""
        pieces = self._pieces.get(key)
        if not pieces:
            return False
        start, rows = pieces[-1]  # the usual answer; after a rewrite an earlier piece may reach
        return start + len(rows) >= end or any(s + len(r) >= end for s, r in pieces)

    def take_parts(self, key: str) -> list[tuple[int, Any]]:
        """The pieces of `key` as they came (no copy); `join_parts` assembles them."""
        parts = self._pieces.pop(key, [])
        self.nbytes -= sum(rows.nbytes for _, rows in parts)
        return parts

    def take(self, key: str) -> torch.Tensor | None:
        """`(num_positions, num_aux, H)` for positions 0.. of `key` (None if nothing came);
        raises when a position was never written."""
        return join_parts(key, self.take_parts(key), self.dtype)

    def discard(self, key: str) -> None:
        parts = self._pieces.pop(key, [])
        self.nbytes -= sum(rows.nbytes for _, rows in parts)


_BITS = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def row_bits(rows: torch.Tensor):
    """A tensor's bytes as a numpy integer array of its shape (no copy; any dtype)."""
    import torch

    return rows.view(getattr(torch, _BITS[rows.element_size()])).numpy()


def from_bits(bits, dtype: torch.dtype) -> torch.Tensor:
    """`row_bits` undone: the numpy array's bytes as a tensor of `dtype` (no copy)."""
    import torch

    return torch.from_numpy(bits).view(dtype)


def as_rows(piece, dtype: torch.dtype) -> torch.Tensor:
    """A piece as a tensor: `row_bits` views become `dtype` again, tensors pass."""
    import numpy as np

    return from_bits(piece, dtype) if isinstance(piece, np.ndarray) else piece


def as_bits(piece):
    """A piece as `row_bits`: tensors become their bits, numpy views pass."""
    import numpy as np

    return piece if isinstance(piece, np.ndarray) else row_bits(piece)


def join_parts(key: str, parts: list[tuple[int, Any]], dtype=None) -> torch.Tensor | None:
    """One request's rows from its pieces, in arrival order (last write wins); raises on holes."""
    import torch

    if not parts:
        return None
    parts = [(start, as_rows(rows, dtype)) for start, rows in parts]
    end = max(start + rows.shape[0] for start, rows in parts)
    first = parts[0][1]
    buf = first.new_empty((end, *first.shape[1:]))
    written = torch.zeros(end, dtype=torch.bool)
    for start, rows in parts:
        buf[start : start + rows.shape[0]] = rows
        written[start : start + rows.shape[0]] = True
    if not bool(written.all()):
        missing = (~written).nonzero().flatten()[:8].tolist()
        raise RuntimeError(f"capture {key!r}: positions never written: {missing}")
    return buf


def assemble(chunks: list[CaptureChunk]) -> dict[str, torch.Tensor]:
    """Per-request tensors from step-ordered chunks (last write wins); raises on holes."""
    assembler = CaptureAssembler()
    assembler.add(chunks)
    return {key: assembler.take(key) for key in assembler.keys()}


# --------------------------------------------------------------------------- the final norm


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The target's final RMSNorm with Hugging Face semantics (Qwen/Llama).

    fp32 inside, cast back to the input dtype before the weight (in that dtype)
    multiplies: exactly what HF's `hidden_states[L]` is in a model of this dtype.
    """
    import torch

    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(dtype) * h.to(dtype)


FINAL_NORM_NAMES = ("model.norm.weight", "model.language_model.norm.weight")


def load_final_norm(model_dir: str, revision: str | None = None) -> tuple[torch.Tensor, float]:
    """The final norm's weight (from the checkpoint) and eps (from its config)."""
    from pathlib import Path

    from safetensors import safe_open

    from pipeline.targets.resolve import text_config

    eps = float(text_config(model_dir, revision).rms_norm_eps)

    def fetch(filename: str) -> str | None:
        """A local path of the checkpoint file, or None when the checkpoint has no such file."""
        from pipeline.storage import path_under

        # The name may come from the checkpoint's index (data): it must stay in the model.
        local = path_under(model_dir, filename, f"target {model_dir}: weight file")
        if Path(model_dir).is_dir():
            return str(local) if local.exists() else None
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        try:
            return hf_hub_download(model_dir, filename, revision=revision)
        except EntryNotFoundError:
            return None

    index_path = fetch("model.safetensors.index.json")  # absent for single-file checkpoints
    weight_map = json.loads(Path(index_path).read_text())["weight_map"] if index_path else None
    for name in FINAL_NORM_NAMES:
        filename = weight_map.get(name) if weight_map is not None else "model.safetensors"
        path = fetch(filename) if filename is not None else None
        if path is None:
            continue
        with safe_open(path, framework="pt") as fh:
            if name in fh.keys():
                return fh.get_tensor(name), eps
    raise ValueError(
        f"target {model_dir}: no final norm weight among {FINAL_NORM_NAMES} in its checkpoint"
    )
