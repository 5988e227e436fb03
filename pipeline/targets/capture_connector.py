"""Device-agnostic hidden-state capture for vLLM's ``extract_hidden_states``.

How vLLM produces the data
--------------------------
With ``speculative_config={"method": "extract_hidden_states", ...}`` the target
model returns, next to its output, the residual stream (``hidden + residual``)
after each requested decoder layer ("aux ids", in ascending layer order). The
``ExtractHiddenStatesProposer`` then runs a one-layer dummy "draft" model whose
only attention layer (a ``CacheOnlyAttentionLayer``) scatters those rows into a
paged cache of its own, exactly like K/V: one slot per token position, each slot
holding ``[num_aux_layers, hidden_size]``. The proposer "drafts" one token per
step; every decode step therefore schedules two positions per request (the
real last token and a throw-away draft) and the draft row is overwritten the
next step when the draft is rejected.

What this connector does
------------------------
vLLM's reference ``ExampleHiddenStatesConnector`` waits until a request finishes,
then copies its rows out of the cache with CUDA streams and pinned memory and
writes one safetensors file per request. This connector instead copies, *every
engine step*, the rows that the step just wrote (positions
``[num_computed_tokens, num_computed_tokens + num_scheduled_tokens)`` of each
capturing request) and hands them to a *sink* as one ``CaptureChunk`` per step.
Because the copy happens synchronously inside the step (in ``wait_for_save``,
which vLLM calls after the draft forward), every row of a request is in the
sink before the engine even emits that request's final ``RequestOutput``: the
owner can assemble a request as soon as ``LLM.generate`` returns, with no
locks, no polling and no delayed block freeing.

Rows of a later step overwrite rows of an earlier step at the same position
(rejected draft positions, recomputation after preemption): assembly is
"last write wins" in step order.

Why not return the rows in ``RequestOutput.kv_transfer_params``? In vLLM 0.32
``build_connector_worker_meta`` (the only worker -> scheduler data path) runs
right after the *target* forward, before the draft forward writes the step's
rows, and the scheduler calls ``request_finished`` before
``update_connector_output``. The rows of a request's last step would arrive
one step after its output has left. Hence a side channel (the sink).

Sinks (``kv_connector_extra_config["capture_transport"]``)
---------------------------------------------------------
* ``"spool"`` (default): one file per engine step in ``capture_dir`` (use a
  tmpfs such as ``/dev/shm``); works with vLLM's engine-core subprocess
  (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, the default), inside Ray actors, and with
  TP > 1 (only TP rank 0 writes; rank 0 runs on the owner's node). Written
  atomically (temp name + rename).
* ``"inprocess"``: chunks go to a module-level registry; only valid when the
  worker runs in the owner's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and a
  single worker). Zero file I/O.
* ``"discard"``: rows are gathered and dropped (profiling only).

The worker logs the time it spent in ``wait_for_save`` at shutdown.

Per-request opt-in
------------------
A request is captured only when its ``SamplingParams.extra_args`` carry
``{"kv_transfer_params": {"capture_key": <our sample id>,
"include_output_tokens": True}}``. ``capture_key`` names the result (vLLM's own
request ids restart at 0 per engine and are suffixed internally); without
``include_output_tokens`` only prompt positions are kept.

Owner side
----------
``CaptureReader(capture_dir, transport).collect()`` drains all chunks written
since the previous call and returns ``{capture_key: tensor[num_positions,
num_aux_layers, hidden]}`` (positions 0..n-1 of prompt + generated tokens; the
final sampled token is never fed back, so it has no row). Use
``trim_to(result, len(prompt) + len(output) - 1)`` to drop any draft row
beyond the last fed position.

Only ``torch`` indexing and ``.to("cpu")`` are used: no CUDA streams, events or
pinned buffers, so the same code runs on CPU, CUDA, ROCm or XPU.
"""

from __future__ import annotations

import itertools
import os
import pickle
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger(__name__)

CONNECTOR_NAME = "HiddenStateCaptureConnector"
CONNECTOR_MODULE = __name__
CACHE_LAYER_MARKER = "cache_only_layers"


# --------------------------------------------------------------------------
# Data exchanged between the scheduler, the worker and the owner
# --------------------------------------------------------------------------
@dataclass
class CaptureSpan:
    """Positions ``[start, start + length)`` of one request, written this step.

    ``block_ids`` are the hidden-state cache blocks covering the span, the first
    of them holding position ``first_block * block_size``.
    """

    key: str
    start: int
    length: int
    first_block: int
    block_ids: list[int]


@dataclass
class CaptureMetadata(KVConnectorMetadata):
    step: int = -1
    spans: list[CaptureSpan] = field(default_factory=list)


@dataclass
class CaptureChunk:
    """Rows written by one engine step, for all capturing requests.

    ``rows[offsets[i] : offsets[i] + lengths[i]]`` are positions
    ``starts[i] ...`` of request ``keys[i]``; ``rows`` is
    ``[total_rows, num_aux_layers, hidden_size]`` on CPU, in the model dtype.
    """

    step: int
    keys: list[str]
    starts: list[int]
    lengths: list[int]
    rows: torch.Tensor


# --------------------------------------------------------------------------
# Sinks
# --------------------------------------------------------------------------
_INPROCESS: dict[str, list[CaptureChunk]] = defaultdict(list)
_INPROCESS_LOCK = threading.Lock()


def _put_inprocess(channel: str, chunk: CaptureChunk) -> None:
    with _INPROCESS_LOCK:
        _INPROCESS[channel].append(chunk)


def _take_inprocess(channel: str) -> list[CaptureChunk]:
    with _INPROCESS_LOCK:
        return _INPROCESS.pop(channel, [])


def _write_spool(directory: str, writer_id: str, chunk: CaptureChunk) -> None:
    """One pickle (protocol 5) per step: metadata + the rows' raw bytes."""
    name = f"{chunk.step:012d}-{writer_id}.pkl"
    tmp = os.path.join(directory, f".{name}.tmp")
    rows = chunk.rows.contiguous()
    payload = (
        chunk.step,
        chunk.keys,
        chunk.starts,
        chunk.lengths,
        str(rows.dtype).removeprefix("torch."),
        tuple(rows.shape),
        rows.view(torch.uint8).numpy(),
    )
    with open(tmp, "wb") as f:
        pickle.dump(payload, f, protocol=5)
    os.replace(tmp, os.path.join(directory, name))


def _read_spool(directory: str) -> list[CaptureChunk]:
    names = sorted(n for n in os.listdir(directory) if n.endswith(".pkl") and not n.startswith("."))
    chunks = []
    for name in names:
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            step, keys, starts, lengths, dtype, shape, raw = pickle.load(f)
        os.remove(path)
        rows = torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)
        chunks.append(CaptureChunk(step, keys, starts, lengths, rows))
    return chunks


# --------------------------------------------------------------------------
# Owner side
# --------------------------------------------------------------------------
def capture_params(key: str, include_output_tokens: bool = True) -> dict[str, Any]:
    """``SamplingParams.extra_args`` that make one request captured under ``key``."""
    return {
        "kv_transfer_params": {
            "capture_key": str(key),
            "include_output_tokens": bool(include_output_tokens),
        }
    }


def kv_transfer_config(
    capture_dir: str | None = None,
    transport: str = "spool",
    module_path: str = CONNECTOR_MODULE,
) -> dict[str, Any]:
    """The ``kv_transfer_config`` argument of ``vllm.LLM`` for this connector."""
    extra: dict[str, Any] = {"capture_transport": transport}
    if transport == "spool":
        if not capture_dir:
            raise ValueError("the spool transport needs capture_dir")
        extra["capture_dir"] = capture_dir
    elif transport == "inprocess":
        extra["capture_channel"] = capture_dir or uuid.uuid4().hex
    elif transport == "discard":
        pass
    else:
        raise ValueError(f"unknown capture transport {transport!r}")
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": module_path,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": extra,
    }


def speculative_config(aux_layer_ids: list[int]) -> dict[str, Any]:
    """The ``speculative_config`` argument of ``vllm.LLM`` capturing ``aux_layer_ids``.

    Aux id k = residual stream after k decoder layers (0 = embeddings, L = the
    last layer's output before the final norm). vLLM emits them in ascending
    layer order whatever the list order, so the list must be sorted and unique.
    """
    ids = [int(i) for i in aux_layer_ids]
    if ids != sorted(set(ids)):
        raise ValueError(f"aux layer ids must be sorted and unique: {ids}")
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}},
    }


class CaptureReader:
    """Owner-side view of one engine's captures (same ``kv_transfer_config``)."""

    def __init__(self, config: dict[str, Any]):
        extra = config["kv_connector_extra_config"]
        self.transport = extra["capture_transport"]
        self.capture_dir = extra.get("capture_dir")
        self.channel = extra.get("capture_channel")

    def take_chunks(self) -> list[CaptureChunk]:
        if self.transport == "spool":
            chunks = _read_spool(self.capture_dir)
        else:
            chunks = _take_inprocess(self.channel)
        chunks.sort(key=lambda c: c.step)
        return chunks

    def collect(self) -> dict[str, torch.Tensor]:
        """Drain every chunk written so far; ``{key: [positions, layers, hidden]}``.

        Call after ``LLM.generate`` returned (every row of a finished request is
        written before its output is emitted). Later steps overwrite earlier
        ones at the same position.
        """
        pieces: dict[str, list[tuple[int, torch.Tensor]]] = defaultdict(list)
        for chunk in self.take_chunks():
            offset = 0
            for key, start, length in zip(chunk.keys, chunk.starts, chunk.lengths):
                pieces[key].append((start, chunk.rows[offset : offset + length]))
                offset += length
        out: dict[str, torch.Tensor] = {}
        for key, parts in pieces.items():
            end = max(s + r.shape[0] for s, r in parts)
            first = parts[0][1]
            buf = first.new_empty((end, *first.shape[1:]))
            written = torch.zeros(end, dtype=torch.bool)
            for start, rows in parts:
                buf[start : start + rows.shape[0]] = rows
                written[start : start + rows.shape[0]] = True
            if not bool(written.all()):
                missing = (~written).nonzero().flatten()[:8].tolist()
                raise RuntimeError(f"capture {key!r}: positions never written: {missing}...")
            out[key] = buf
        return out


def trim_to(rows: torch.Tensor, num_fed_positions: int) -> torch.Tensor:
    """Keep positions ``0 .. num_fed_positions-1`` (prompt + output minus one)."""
    if rows.shape[0] < num_fed_positions:
        raise RuntimeError(f"captured {rows.shape[0]} positions, expected {num_fed_positions}")
    return rows[:num_fed_positions]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The target's final RMSNorm (HF Qwen/Llama semantics), for aux id L."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight.to(dtype) * h.to(dtype)


# --------------------------------------------------------------------------
# The connector (instantiated by vLLM: once with role SCHEDULER in the engine
# core, once with role WORKER in every worker)
# --------------------------------------------------------------------------
class HiddenStateCaptureConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        spec = vllm_config.speculative_config
        if spec is None or spec.method != "extract_hidden_states":
            raise ValueError(
                f"{CONNECTOR_NAME} needs speculative_config method 'extract_hidden_states'"
            )
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self._transport = extra.get("capture_transport", "spool")
        self._capture_dir = extra.get("capture_dir")
        self._channel = extra.get("capture_channel")
        if self._transport == "spool":
            if not self._capture_dir:
                raise ValueError("capture_transport 'spool' needs capture_dir")
            os.makedirs(self._capture_dir, exist_ok=True)
        elif self._transport not in ("inprocess", "discard"):
            raise ValueError(f"unknown capture_transport {self._transport!r}")

        # Scheduler side.
        self._group_id = self._find_group_id(kv_cache_config)
        self._block_size = self._group_block_size(vllm_config, kv_cache_config, self._group_id)
        self._keys: dict[str, str] = {}  # vLLM request id -> capture key
        self._prompt_only: dict[str, int] = {}  # request id -> prompt length
        self._seen: set[str] = set()
        self._step = itertools.count()

        # Worker side.
        self._cache: torch.Tensor | None = None
        self._writes = True  # TP rank 0 only; set in register_kv_caches
        self._writer_id = f"{os.getpid()}"
        self._save_s = 0.0
        self._save_steps = 0
        self._save_rows = 0

    # ---------------------------------------------------------------- helpers
    @staticmethod
    def _find_group_id(kv_cache_config: KVCacheConfig | None) -> int:
        if kv_cache_config is None:
            return 0
        groups = kv_cache_config.kv_cache_groups
        hits = [
            gid
            for gid, group in enumerate(groups)
            if any(CACHE_LAYER_MARKER in name for name in group.layer_names)
        ]
        if len(hits) != 1:
            raise ValueError(f"cannot locate the hidden-state cache group among {len(groups)}")
        return hits[0]

    @staticmethod
    def _group_block_size(
        vllm_config: VllmConfig, kv_cache_config: KVCacheConfig | None, gid: int
    ) -> int:
        if kv_cache_config is None:
            return vllm_config.cache_config.block_size
        return kv_cache_config.kv_cache_groups[gid].kv_cache_spec.block_size

    # ============================================================ scheduler
    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False  # store-only

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        return None

    def on_new_request(self, request: Request) -> None:
        params = request.kv_transfer_params or {}
        key = params.get("capture_key")
        if key is None:
            return
        self._keys[request.request_id] = str(key)
        if not params.get("include_output_tokens", False):
            self._prompt_only[request.request_id] = request.num_prompt_tokens

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = CaptureMetadata(step=next(self._step))
        if not self._keys:
            return meta
        computed: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            computed[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, n in zip(cached.req_ids, cached.num_computed_tokens):
            computed[req_id] = n
        resumed = cached.resumed_req_ids
        bs = self._block_size
        for req_id, num_new in scheduler_output.num_scheduled_tokens.items():
            key = self._keys.get(req_id)
            if key is None:
                continue
            end = computed[req_id] + num_new
            # First time (or after preemption) also emit positions served from
            # the prefix cache: their rows are in the shared cached blocks.
            start = 0 if (req_id not in self._seen or req_id in resumed) else computed[req_id]
            self._seen.add(req_id)
            limit = self._prompt_only.get(req_id)
            if limit is not None:
                end = min(end, limit)
            if end <= start:
                continue
            assert self._kv_cache_manager is not None
            blocks = self._kv_cache_manager.get_block_ids(req_id)[self._group_id]
            first, last = start // bs, (end - 1) // bs
            meta.spans.append(
                CaptureSpan(key, start, end - start, first, list(blocks[first : last + 1]))
            )
        return meta

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        req_id = request.request_id
        self._seen.discard(req_id)
        self._prompt_only.pop(req_id, None)
        key = self._keys.pop(req_id, None)
        if key is None:
            return False, None
        # Echo the key: the owner can match outputs without relying on vLLM ids.
        return False, {"capture_key": key}

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, [])

    # ============================================================== worker
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

        layers = get_layers_from_vllm_config(
            self._vllm_config, CacheOnlyAttentionLayer, list(kv_caches.keys())
        )
        if len(layers) != 1:
            raise ValueError(f"expected one CacheOnlyAttentionLayer, found {list(layers)}")
        name = next(iter(layers))
        self._cache = kv_caches[name]
        self._writes = get_tensor_model_parallel_rank() == 0
        # Layout written by CacheOnlyAttentionImpl: [blocks, layers, block, hidden].
        layer = layers[name]
        if self._cache.dim() != 4 or self._cache.shape[1] != layer.num_heads or self._cache.shape[3] != layer.head_size:
            raise ValueError(f"unexpected hidden-state cache shape {tuple(self._cache.shape)}")
        self._block_size = self._cache.shape[2]
        logger.info(
            "%s: cache %s %s, transport %s", CONNECTOR_NAME, name, tuple(self._cache.shape), self._transport
        )

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        return None  # rows are read in wait_for_save, after the draft forward

    def wait_for_save(self) -> None:
        """Copy this step's rows out of the hidden-state cache, hand them to the sink."""
        if not self._writes or self._cache is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, CaptureMetadata) or not meta.spans:
            return
        t0 = time.perf_counter()
        bs = self._block_size
        slot_lists = []
        for span in meta.spans:
            pos = torch.arange(span.start, span.start + span.length, dtype=torch.long)
            blocks = torch.tensor(span.block_ids, dtype=torch.long)
            slot_lists.append(blocks[pos // bs - span.first_block] * bs + pos % bs)
        slots = torch.cat(slot_lists).to(self._cache.device)
        rows = self._cache[slots // bs, :, slots % bs].to("cpu")
        chunk = CaptureChunk(
            step=meta.step,
            keys=[s.key for s in meta.spans],
            starts=[s.start for s in meta.spans],
            lengths=[s.length for s in meta.spans],
            rows=rows,
        )
        if self._transport == "spool":
            _write_spool(self._capture_dir, self._writer_id, chunk)
        elif self._transport == "inprocess":
            _put_inprocess(self._channel, chunk)
        self._save_s += time.perf_counter() - t0
        self._save_steps += 1
        self._save_rows += rows.shape[0]

    def shutdown(self) -> None:
        if self._role == KVConnectorRole.WORKER and self._save_steps:
            logger.info(
                "%s: %d steps, %d rows, %.3f s in wait_for_save (%.2f ms/step)",
                CONNECTOR_NAME, self._save_steps, self._save_rows, self._save_s,
                1e3 * self._save_s / self._save_steps,
            )

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return None
