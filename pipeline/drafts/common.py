"""Qwen3 building blocks every draft kind shares, and `TargetHeadDraft`, the base of every draft.

`Attention` holds the Qwen3 projections (q/k norms, RoPE with the target's
scaling, GQA) and the DSpark block attention (pipeline/drafts/block_mask.py);
EAGLE-3 reuses its projections. `TargetHeadDraft` is the base of every draft:
the target's embeddings and lm_head (pipeline/drafts/target_head.py), frozen,
as non-persistent buffers (neither the optimiser nor checkpoints carry them;
the trainer keeps DDP from broadcasting them), stored in the training
precision (bf16 for a bf16 run: 1.6 GB instead of 3.1 for two 151,936 x 2560
tables, a 4B target's), and the target logits rebuilt from a stored
post-norm final hidden state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.drafts.block_mask import BlockMask
from pipeline.drafts.spec import DraftSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_frequencies(spec: DraftSpec) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim/2,) fp32, attention scaling) of the draft's RoPE: theta and
    the target's scaling (`spec.rope_scaling`), computed by transformers' own RoPE
    init functions, so they equal what a Qwen3 layer built from the export's
    `transformer_layer_config` (vLLM, speculators) computes."""
    hd = spec.head_dim
    plain = 1.0 / (spec.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    if not spec.rope_scaling:
        return plain, 1.0
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {**spec.rope_scaling, "rope_theta": spec.rope_theta}
    config = Qwen3Config(
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_heads,
        head_dim=hd,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters=params,
    )
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    return inv_freq.float(), float(scaling)


def rope(
    x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float = 1.0
) -> torch.Tensor:
    """Neox-style rotary embedding. x (..., T, D), positions (..., T) broadcastable,
    inv_freq (D/2,) (rope_frequencies); cos/sin times `scaling` (YaRN's attention factor)."""
    dim = x.shape[-1]
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(x.device)  # (..., T, D/2)
    cos = (torch.cat([angles.cos(), angles.cos()], -1) * scaling).to(x.dtype)
    sin = (torch.cat([angles.sin(), angles.sin()], -1) * scaling).to(x.dtype)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, spec: DraftSpec, in_dim: int | None = None) -> None:
        super().__init__()
        d, h, kv, hd = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        i = in_dim or d  # EAGLE-3 reads a 2d-wide [embedding ; hidden] input
        self.h, self.kv, self.hd = h, kv, hd
        inv_freq, self.rope_scaling = rope_frequencies(spec)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.q_proj = nn.Linear(i, h * hd, bias=False)
        self.k_proj = nn.Linear(i, kv * hd, bias=False)
        self.v_proj = nn.Linear(i, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
        self.k_norm = RMSNorm(hd, spec.rms_norm_eps)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """RoPE of the draft (the target's theta and scaling) at `positions`."""
        return rope(x, positions, self.inv_freq, self.rope_scaling)

    def _kv(
        self, x: torch.Tensor, positions: torch.Tensor, repeat: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # x (R, T, d), positions (R, T) -> k, v (R, h, T, hd) with GQA heads repeated
        # (repeat=False: (R, kv, T, hd), for kernels that take GQA as it is)
        r, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(r, t, self.kv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(r, t, self.kv, self.hd).transpose(1, 2)
        k = self.rotate(k, positions[:, None, :])
        if not repeat:
            return k, v
        rep = self.h // self.kv
        return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

    def forward(
        self,
        x: torch.Tensor,  # (R, Q, d) block tokens, already normed
        positions: torch.Tensor,  # (R, Q)
        ctx: torch.Tensor,  # (R, Tc, d) fused context (hidden_norm(fc(features)))
        ctx_positions: torch.Tensor,  # (R, Tc)
        mask: BlockMask,
    ) -> torch.Tensor:
        r, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(r, q_len, self.h, self.hd)).transpose(1, 2)
        q = self.rotate(q, positions[:, None, :])  # (R, h, Q, hd)
        if mask.attention == "eager":
            out = self._eager(q, x, positions, ctx, ctx_positions, mask)
        else:
            k_blk, v_blk = self._kv(x, positions, repeat=False)  # (R, kv, Q, hd)
            k_ctx, v_ctx = self._kv(ctx, ctx_positions, repeat=False)  # (R, kv, Tc, hd)
            k = torch.cat([k_ctx, k_blk], dim=2)  # (R, kv, Tc + Q, hd)
            v = torch.cat([v_ctx, v_blk], dim=2)
            if mask.attention == "sdpa":
                out = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask.full, enable_gqa=self.h != self.kv
                )
            else:
                out = mask.flex_fn(q, k, v, block_mask=mask.flex, enable_gqa=self.h != self.kv)
        return self.o_proj(out.transpose(1, 2).reshape(r, q_len, self.h * self.hd))

    def _eager(self, q, x, positions, ctx, ctx_positions, mask: BlockMask) -> torch.Tensor:
        """The reference: context scores and per-block scores under one fp32 softmax."""
        r, _, q_len, _ = q.shape
        block_size = mask.block_size
        nb = q_len // block_size
        k_blk, v_blk = self._kv(x, positions)  # (R, h, Q, hd)
        k_ctx, v_ctx = self._kv(ctx, ctx_positions)  # (R, h, Tc, hd)
        scale = self.hd**-0.5
        s_ctx = (q @ k_ctx.transpose(-1, -2)) * scale  # (R, h, Q, Tc)
        s_ctx = s_ctx.masked_fill(~mask.ctx[:, None], float("-inf"))
        qb = q.view(r, self.h, nb, block_size, self.hd)
        kb = k_blk.view(r, self.h, nb, block_size, self.hd)
        vb = v_blk.view(r, self.h, nb, block_size, self.hd)
        s_blk = (qb @ kb.transpose(-1, -2)) * scale  # (R, h, Nb, B, B)
        s_blk = s_blk.reshape(r, self.h, q_len, block_size)
        p = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1).float(), dim=-1).to(q.dtype)
        p_ctx, p_blk = p[..., : s_ctx.shape[-1]], p[..., s_ctx.shape[-1] :]
        out = p_ctx @ v_ctx  # (R, h, Q, hd)
        return out + (p_blk.view(r, self.h, nb, block_size, block_size) @ vb).view_as(out)


class MLP(nn.Module):
    def __init__(self, spec: DraftSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """c * tanh(logits / c) (Gemma's final logit soft-capping); unchanged for cap None."""
    return logits if cap is None else cap * torch.tanh(logits / cap)


class TargetHeadDraft(nn.Module):
    """Base of every draft: the target's embeddings and lm_head, frozen (module docstring).

    `frozen_dtype` stores the two tables in that dtype (None: as given).
    `attention` picks the block-attention implementation (ATTENTION); it is a
    runtime choice, not part of the spec: every implementation computes the
    same function."""

    attention: str = "sdpa"

    def __init__(
        self,
        spec: DraftSpec,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        frozen_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.spec = spec
        tied = embed is lm_head or (
            embed.shape == lm_head.shape and embed.data_ptr() == lm_head.data_ptr()
        )
        embed = embed.detach().to(frozen_dtype or embed.dtype)
        self.register_buffer("embed_tokens", embed.clone(), persistent=False)
        # A target with tied embeddings keeps one table (`lm_head` then reads it).
        head = None if tied else lm_head.detach().to(frozen_dtype or lm_head.dtype).clone()
        self.register_buffer("lm_head_weight", head, persistent=False)
        # A reduced draft vocabulary (pipeline/drafts/vocab.py): the draft's head is the
        # target head's rows of those tokens, frozen as the full head is (speculators
        # does the same); `draft_ids` maps a draft id to its target id, `target_to_draft`
        # back (-1: not in the draft vocabulary).
        self.register_buffer("draft_ids", None, persistent=False)
        self.register_buffer("target_to_draft", None, persistent=False)
        self.register_buffer("draft_head", None, persistent=False)
        if spec.draft_vocab is not None:
            ids = torch.tensor(spec.draft_vocab, dtype=torch.long)
            back = torch.full((spec.vocab_size,), -1, dtype=torch.long)
            back[ids] = torch.arange(ids.shape[0])
            self.draft_ids, self.target_to_draft = ids, back
            self.draft_head = self.lm_head[ids].clone()

    @property
    def lm_head(self) -> torch.Tensor:
        """(V, d) the target's frozen lm_head (its embedding table when tied)."""
        return self.embed_tokens if self.lm_head_weight is None else self.lm_head_weight

    @property
    def output_head(self) -> torch.Tensor:
        """(Vd, d) the draft's own head: the target head's rows of the draft vocabulary."""
        return self.lm_head if self.draft_head is None else self.draft_head

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> target ids (unchanged for a full vocabulary)."""
        return draft_ids if self.draft_ids is None else self.draft_ids[draft_ids]

    def to_draft_ids(self, target_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft-vocabulary ids, -1 for a token outside it."""
        return target_ids if self.target_to_draft is None else self.target_to_draft[target_ids]

    def to_target_vocab(self, values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """(..., Vd) -> (..., V): per-token values of the draft vocabulary scattered to
        their target ids, `fill` elsewhere (probabilities: 0; logits: -inf)."""
        if self.draft_ids is None:
            return values
        out = values.new_full((*values.shape[:-1], self.spec.vocab_size), fill)
        out[..., self.draft_ids] = values
        return out

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The target's embedding of `ids` (scaled as the target scales it), in `dtype`."""
        x = F.embedding(ids, self.embed_tokens).to(dtype)
        return x * self.spec.embed_scale if self.spec.embed_scale != 1.0 else x

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., Vd): the draft's frozen head (and the target's soft-cap) on
        `hidden`; Vd = V unless the draft vocabulary is reduced."""
        return softcap(hidden @ self.output_head.T.to(hidden.dtype), self.spec.logit_softcap)

    def output_logits(self, hidden: torch.Tensor, markov: torch.Tensor | None) -> torch.Tensor:
        """The draft's logits from its final hidden state (and Markov input, if it has one)."""
        return self.head_logits(hidden)

    def target_logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """The target's logits rebuilt from its post-norm final hidden state."""
        return softcap(last_hidden.to(self.lm_head.dtype) @ self.lm_head.T, self.spec.logit_softcap)

    def teacher_logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., Vd): the target's logits at the draft vocabulary's tokens,
        what the loss's softmax renormalises (EAGLE-3's restricted target; all of
        `target_logits` for a full vocabulary)."""
        head = self.output_head
        return softcap(last_hidden.to(head.dtype) @ head.T, self.spec.logit_softcap)
