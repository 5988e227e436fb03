"""vLLM KV connector that copies captured hidden states out of the engine, every step.

Loaded by vLLM itself (`kv_connector_module_path`) in the engine-core process
(role SCHEDULER) and in every worker (role WORKER); the owner of the engine
never imports it. Owner-side helpers (engine arguments, the spool format,
assembly) live in `pipeline.targets.capture`. See docs/capture.md.

How vLLM produces the rows: with `speculative_config={"method":
"extract_hidden_states", ...}` the target returns the residual stream
(`hidden + residual`) after each requested decoder layer, in ascending layer
order, and the `ExtractHiddenStatesProposer` runs a dummy "draft" whose only
layer (`CacheOnlyAttentionLayer`) scatters them into a paged cache of its own,
like K/V: one slot per token position holding (num_aux, H). The proposer
"drafts" one token per step, so every decode step schedules two positions per
request (the real last token and a throw-away draft); a rejected draft's row
is overwritten the next step.

What this connector does: the scheduler side records, per step, the positions
each capturing request computes (`[num_computed, num_computed + scheduled)`,
plus `[0, num_computed)` on a request's first step) and the hidden-state cache
blocks that hold them. The worker side, in `wait_for_save` (vLLM calls it
after the draft forward of the same step), gathers those slots, copies them to
CPU as one `CaptureChunk` and hands it to the sink. So every row of a request
is in the sink before the engine emits the request's final output: the owner
assembles results right after `LLM.generate` returns, with no locks, polling
or delayed block frees. Only plain tensor indexing and `.to("cpu")`: no CUDA
streams, events or pinned buffers (vLLM's `ExampleHiddenStatesConnector`
needs them), so the same code runs on CPU and GPUs. With TP > 1 only TP rank 0
writes (its rank runs on the owner's node under vLLM's executors).

Why a side channel: in vLLM 0.32 the worker -> scheduler metadata
(`build_connector_worker_meta`) is built right after the *target* forward,
before the draft forward writes the rows, and the scheduler calls
`request_finished` before `update_connector_output`, so the last step's rows
would arrive after the request's output has left.

Per-request opt-in: `SamplingParams.extra_args = capture.capture_params(key)`.
Requests without it are served and not captured. The key is echoed in
`RequestOutput.kv_transfer_params`.
"""

from __future__ import annotations

import itertools
import os
import time
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

from pipeline.targets.capture import CONNECTOR_NAME, CaptureChunk, put_inprocess
from pipeline.targets.capture_chunks import write_spool

if TYPE_CHECKING:
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = init_logger(__name__)

# The extract_hidden_states draft registers its cache layer under this name.
CACHE_LAYER_MARKER = "cache_only_layers"


@dataclass
class CaptureSpan:
    """Positions `[start, start + length)` of one request, computed this step.

    `block_ids` are the hidden-state cache blocks covering the span; the first
    holds positions from `first_block * block_size`.
    """

    key: str
    start: int
    length: int
    first_block: int
    block_ids: list[int]


@dataclass
class CaptureMetadata(KVConnectorMetadata):
    """Scheduler -> worker, once per step."""

    step: int = -1
    spans: list[CaptureSpan] = field(default_factory=list)


class HiddenStateCaptureConnector(KVConnectorBase_V1, SupportsHMA):
    """Store-only connector: copies each step's captured rows to the configured sink.

    vLLM builds one instance with role SCHEDULER (engine core) and one with role
    WORKER per worker; `kv_connector_extra_config` carries `capture_transport`
    and `capture_dir` / `capture_channel` (see `capture.kv_transfer_config`).
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
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
        self._group_id = _hidden_state_group(kv_cache_config)
        if kv_cache_config is None:
            self._block_size = vllm_config.cache_config.block_size
        else:
            group = kv_cache_config.kv_cache_groups[self._group_id]
            self._block_size = group.kv_cache_spec.block_size
        self._keys: dict[str, str] = {}  # vLLM request id -> capture key
        self._seen: set[str] = set()  # requests scheduled at least once
        self._step = itertools.count()

        # Worker side.
        self._cache: torch.Tensor | None = None  # (num_blocks, num_aux, block_size, H)
        self._writes = True  # TP rank 0 only; set in register_kv_caches
        self._writer_id = str(os.getpid())
        self._save_s = 0.0
        self._save_steps = 0
        self._save_rows = 0

    # ------------------------------------------------------------------ scheduler side

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        return 0, False  # store-only: never loads anything

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        return None

    def on_new_request(self, request: Request) -> None:
        key = (request.kv_transfer_params or {}).get("capture_key")
        if key is not None:
            self._keys[request.request_id] = str(key)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The spans every capturing request computes this step, with their cache blocks."""
        meta = CaptureMetadata(step=next(self._step))
        if not self._keys:
            return meta
        computed: dict[str, int] = {}
        for new in scheduler_output.scheduled_new_reqs:
            computed[new.req_id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, n in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            computed[req_id] = n
        resumed = cached.resumed_req_ids
        bs = self._block_size
        assert self._kv_cache_manager is not None
        for req_id, num_new in scheduler_output.num_scheduled_tokens.items():
            key = self._keys.get(req_id)
            if key is None:
                continue
            end = computed[req_id] + num_new
            # On a request's first step (or after preemption) also emit positions
            # computed earlier (prefix-cache hits): their rows sit in its blocks.
            first_time = req_id not in self._seen or req_id in resumed
            start = 0 if first_time else computed[req_id]
            self._seen.add(req_id)
            if end <= start:
                continue
            blocks = self._kv_cache_manager.get_block_ids(req_id)[self._group_id]
            first, last = start // bs, (end - 1) // bs
            meta.spans.append(
                CaptureSpan(key, start, end - start, first, list(blocks[first : last + 1]))
            )
        return meta

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._seen.discard(request.request_id)
        key = self._keys.pop(request.request_id, None)
        if key is None:
            return False, None
        # Blocks are freed at once (rows were copied inside their step); the key
        # is echoed so the owner can match outputs without vLLM's request ids.
        return False, {"capture_key": key}

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, [])

    # ------------------------------------------------------------------ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
        from vllm.model_executor.models.extract_hidden_states import CacheOnlyAttentionLayer

        layers = get_layers_from_vllm_config(
            self._vllm_config, CacheOnlyAttentionLayer, list(kv_caches.keys())
        )
        if len(layers) != 1:
            raise ValueError(f"expected one CacheOnlyAttentionLayer, found {list(layers)}")
        name, layer = next(iter(layers.items()))
        cache = kv_caches[name]
        # Layout written by CacheOnlyAttentionImpl: (num_blocks, num_aux, block_size, H).
        if (
            cache.dim() != 4
            or cache.shape[1] != layer.num_heads
            or cache.shape[3] != layer.head_size
        ):
            raise ValueError(f"unexpected hidden-state cache shape {tuple(cache.shape)}")
        self._cache = cache
        self._block_size = cache.shape[2]
        self._writes = get_tensor_model_parallel_rank() == 0
        logger.info(
            "%s: cache %s %s, transport %s",
            CONNECTOR_NAME,
            name,
            tuple(cache.shape),
            self._transport,
        )

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(
        self,
        layer_name: str,
        kv_layer: torch.Tensor,
        attn_metadata: AttentionMetadata,
        **kwargs: Any,
    ) -> None:
        return None  # rows are read in wait_for_save, after the draft forward wrote them

    def wait_for_save(self) -> None:
        """Gather this step's rows from the hidden-state cache; hand them to the sink."""
        if not self._writes or self._cache is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        if not isinstance(meta, CaptureMetadata) or not meta.spans:
            return
        started = time.perf_counter()
        bs = self._block_size
        block_of: list[int] = []  # cache block of each row
        offset_of: list[int] = []  # slot inside that block
        for span in meta.spans:
            for pos in range(span.start, span.start + span.length):
                block_of.append(span.block_ids[pos // bs - span.first_block])
                offset_of.append(pos % bs)
        device = self._cache.device
        blocks = torch.tensor(block_of, dtype=torch.long, device=device)
        offsets = torch.tensor(offset_of, dtype=torch.long, device=device)
        rows = self._cache[blocks, :, offsets].to("cpu")  # (num_rows, num_aux, H): a copy
        chunk = CaptureChunk(
            step=meta.step,
            keys=[s.key for s in meta.spans],
            starts=[s.start for s in meta.spans],
            lengths=[s.length for s in meta.spans],
            rows=rows,
        )
        if self._transport == "spool":
            write_spool(self._capture_dir, self._writer_id, chunk)
        elif self._transport == "inprocess":
            put_inprocess(self._channel, chunk)
        self._save_s += time.perf_counter() - started
        self._save_steps += 1
        self._save_rows += rows.shape[0]

    def shutdown(self) -> None:
        if self._role == KVConnectorRole.WORKER and self._save_steps:
            logger.info(
                "%s: %d steps, %d rows, %.3f s in wait_for_save (%.2f ms/step)",
                CONNECTOR_NAME,
                self._save_steps,
                self._save_rows,
                self._save_s,
                1e3 * self._save_s / self._save_steps,
            )

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        return None


def _hidden_state_group(kv_cache_config: KVCacheConfig | None) -> int:
    """Index of the KV-cache group that holds the hidden-state cache layer."""
    if kv_cache_config is None:
        return 0
    groups = kv_cache_config.kv_cache_groups
    hits = [
        gid
        for gid, group in enumerate(groups)
        if any(CACHE_LAYER_MARKER in name for name in group.layer_names)
    ]
    if len(hits) != 1:
        raise ValueError(f"cannot locate the hidden-state cache group among {len(groups)} groups")
    return hits[0]
