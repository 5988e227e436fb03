"""Block attention masks: a block's queries attend to the context slots before its anchor
(same sample) and to their own block.

The implementation is one of `ATTENTION`:

* `sdpa` (default): one `scaled_dot_product_attention` over [context keys ;
  block keys] with a boolean mask; its fused kernels (flash on CPU,
  memory-efficient on GPU) keep no (queries x keys) score tensor for
  backward. The mask itself is (Q x (Tc + Q)) bool per row.
* `flex`: `flex_attention` with a block mask built from the same predicate
  (`context_mask`), block-sparse, compiled (`CompiledFlex`; uncompiled it
  materialises the scores). For GPUs: it has no CPU backward, compiled or
  not. On a CPU host with a C++ compiler torch compiles its forward too
  (static shapes: the no-grad checks); where compiling fails, eager flex
  with one warning.
* `eager`: the reference, a masked matmul over the context and a batched
  (B x B) matmul per block sharing one fp32 softmax; it materialises
  (heads x Q x Tc) scores, fine for tests and small models only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.drafts.inputs import DraftInputs

log = logging.getLogger(__name__)

ATTENTION = ("sdpa", "flex", "eager")


def context_mask(inputs: DraftInputs) -> torch.Tensor:
    """(R, Nb, Tc) bool: block n sees context slot j iff same sample and position < anchor."""
    same = inputs.block_doc[:, :, None] == inputs.ctx_doc[:, None, :]
    before = inputs.ctx_positions[:, None, :] < inputs.block_anchor[:, :, None]
    real = (inputs.block_doc >= 0)[:, :, None]
    return same & before & real


def block_attention_mask(inputs: DraftInputs) -> torch.Tensor:
    """(R, Q, Tc + Q) bool, Q = Nb*B: the full mask over [context keys ; block keys].

    What the `sdpa` path passes to the kernel (and what tests inspect).
    Padding blocks see their own block so that no softmax row is empty.
    """
    r, nb, b = inputs.block_ids.shape
    ctx = context_mask(inputs).repeat_interleave(b, dim=1)  # (R, Q, Tc)
    block_of = torch.arange(nb * b, device=ctx.device) // b
    own = (block_of[:, None] == block_of[None, :]).expand(r, -1, -1)  # (R, Q, Q)
    return torch.cat([ctx, own], dim=-1)


@dataclass
class BlockMask:
    """The block-attention mask in the form `attention` needs, built once per forward."""

    attention: str  # one of ATTENTION
    block_size: int
    ctx: torch.Tensor | None = None  # eager: (R, Q, Tc) bool
    full: torch.Tensor | None = None  # sdpa: (R, 1, Q, Tc + Q) bool
    flex: object | None = None  # flex: torch's BlockMask over (R, Q, Tc + Q)
    flex_fn: Callable[..., torch.Tensor] | None = None  # flex: what computes it (CompiledFlex)


def build_block_mask(inputs: DraftInputs, attention: str) -> BlockMask:
    """The mask of `inputs` for the `attention` implementation (module docstring)."""
    b = inputs.block_ids.shape[2]
    if attention == "eager":
        return BlockMask(attention, b, ctx=context_mask(inputs).repeat_interleave(b, dim=1))
    if attention == "sdpa":
        return BlockMask(attention, b, full=block_attention_mask(inputs)[:, None])
    if attention == "flex":
        return BlockMask(attention, b, flex=_flex_block_mask(inputs), flex_fn=compiled_flex())
    raise ValueError(f"attention {attention!r}: choose one of {list(ATTENTION)}")


def _flex_block_mask(inputs: DraftInputs):
    """torch's flex BlockMask with the predicate of `block_attention_mask`, never dense."""
    from torch.nn.attention.flex_attention import create_block_mask

    r, nb, b = inputs.block_ids.shape
    tc = inputs.ctx_doc.shape[1]
    ctx_doc, ctx_pos = inputs.ctx_doc, inputs.ctx_positions
    blk_doc, blk_anchor = inputs.block_doc, inputs.block_anchor

    def mask_mod(row, head, q, kv):
        blk = q // b
        in_ctx = kv < tc
        kv_ctx = kv.clamp(max=tc - 1)
        doc = blk_doc[row, blk]
        sees_ctx = (ctx_doc[row, kv_ctx] == doc) & (ctx_pos[row, kv_ctx] < blk_anchor[row, blk])
        sees_ctx = sees_ctx & (doc >= 0)
        own = (kv - tc).clamp(min=0) // b == blk
        return (in_ctx & sees_ctx) | (~in_ctx & own)

    q_len = nb * b
    return create_block_mask(
        mask_mod, B=r, H=None, Q_LEN=q_len, KV_LEN=tc + q_len, device=inputs.block_ids.device
    )


class CompiledFlex:
    """`flex_attention` through `torch.compile`, what the `flex` path calls.

    Dynamic shapes on GPUs (a packed batch's shape changes every step); static
    shapes on CPU, where torch 2.13 compiled with dynamic shapes returns wrong
    values for a second shape and its automatic dynamic fails to build (its
    no-grad checks recompile per shape instead). Where compiling fails (no
    working compiler for the device), it warns once and runs eager flex from
    then on: the same function, with the scores materialised."""

    def __init__(self, backend: str | Callable = "inductor") -> None:
        from torch.nn.attention.flex_attention import flex_attention

        self.eager = flex_attention
        self.backend = backend
        self._compiled: dict[str, Callable[..., torch.Tensor]] = {}
        self.failure: str | None = None  # why compiling failed; None: compiled

    def compiled(self, device_type: str) -> Callable[..., torch.Tensor]:
        """The compiled flex_attention for a device type (built once, compiled on first call)."""
        if device_type not in self._compiled:
            self._compiled[device_type] = torch.compile(
                self.eager, dynamic=device_type != "cpu", backend=self.backend
            )
        return self._compiled[device_type]

    def __call__(
        self,
        q: torch.Tensor,  # (R, h, Q, hd)
        k: torch.Tensor,  # (R, kv, Tc + Q, hd)
        v: torch.Tensor,  # (R, kv, Tc + Q, hd)
        *,
        block_mask: object,
        enable_gqa: bool,
    ) -> torch.Tensor:
        if self.failure is None:
            from torch._dynamo.exc import BackendCompilerFailed

            try:
                return self.compiled(q.device.type)(
                    q, k, v, block_mask=block_mask, enable_gqa=enable_gqa
                )
            except BackendCompilerFailed as err:  # inductor's errors included
                inner = getattr(err, "inner_exception", None) or err
                self.failure = f"{type(inner).__name__}: {inner}"
                log.warning(
                    "attention: flex runs uncompiled (materialising the scores): torch could "
                    "not compile flex_attention on %s (%s)",
                    q.device.type,
                    self.failure.splitlines()[0],
                )
        return self.eager(q, k, v, block_mask=block_mask, enable_gqa=enable_gqa)


_COMPILED_FLEX: CompiledFlex | None = None


def compiled_flex() -> CompiledFlex:
    """The process's one CompiledFlex (compiled once, on its first call)."""
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = CompiledFlex()
    return _COMPILED_FLEX
