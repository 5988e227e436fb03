"""What every draft kind shares: its inputs and outputs, Qwen3 building blocks, the target head.

`DraftInputs` is one packed batch as a draft sees it (pipeline/train/data.py
packs it, the evaluators build it per sample); `DraftOutput` is what a
draft's forward returns. `Attention` holds the Qwen3 projections (q/k norms,
RoPE, GQA) and the DSpark block attention; EAGLE-3 reuses its projections.
`TargetHeadDraft` is the base of every draft: the target's embeddings and
lm_head, frozen, as non-persistent buffers (neither the optimiser, DDP nor
checkpoints carry them), and the target logits rebuilt from a stored
post-norm hidden state. `load_target_head` reads them from the target.

Block attention runs in two parts: the context part is one masked matmul over
the row's context, the block part a batched (B x B) matmul per block; both
share one softmax. That avoids materialising the (Q x Q) block-diagonal mask
and runs the same on CPU and GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.train.drafts.spec import DraftSpec


@dataclass
class DraftInputs:
    """One packed batch as the model sees it (R rows, Tc context slots, Nb blocks of B).

    Padding: context slots with ctx_doc == -1 and blocks with block_doc == -1.
    """

    ctx_features: torch.Tensor  # (R, Tc, k*H) captured target layers
    ctx_positions: torch.Tensor  # (R, Tc) int64, position within its own sample
    ctx_doc: torch.Tensor  # (R, Tc) int64, sample index within the row, -1 = pad
    block_ids: torch.Tensor  # (R, Nb, B) int64, [anchor token, mask, ..., mask]
    block_anchor: torch.Tensor  # (R, Nb) int64, anchor position a within its sample
    block_doc: torch.Tensor  # (R, Nb) int64, sample index within the row, -1 = pad
    prev_ids: torch.Tensor  # (R, Nb, B) int64, token before each slot's target (Markov input)
    # (R, Tc) int64, the token at each context slot (0 at padding); EAGLE-3 feeds
    # token j+1 beside the features of token j. None where no caller needs it.
    ctx_ids: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> DraftInputs:
        return DraftInputs(
            **{k: None if v is None else v.to(device) for k, v in self.__dict__.items()}
        )


@dataclass
class DraftOutput:
    logits: torch.Tensor  # (R, Nb, B, V) draft logits incl. the Markov bias
    base_logits: torch.Tensor  # (R, Nb, B, V) logits of the backbone alone (DFlash path)
    hidden: torch.Tensor  # (R, Nb, B, d) after the final norm
    confidence_logit: torch.Tensor | None  # (R, Nb, B) pre-sigmoid acceptance estimate


def context_mask(inputs: DraftInputs) -> torch.Tensor:
    """(R, Nb, Tc) bool: block n sees context slot j iff same sample and position < anchor."""
    same = inputs.block_doc[:, :, None] == inputs.ctx_doc[:, None, :]
    before = inputs.ctx_positions[:, None, :] < inputs.block_anchor[:, :, None]
    real = (inputs.block_doc >= 0)[:, :, None]
    return same & before & real


def block_attention_mask(inputs: DraftInputs) -> torch.Tensor:
    """(R, Q, Tc + Q) bool, Q = Nb*B: the full mask over [context keys ; block keys].

    Only for tests and inspection: the model never builds the (Q x Q) part.
    Padding blocks see their own block so that no softmax row is empty.
    """
    r, nb, b = inputs.block_ids.shape
    ctx = context_mask(inputs).repeat_interleave(b, dim=1)  # (R, Q, Tc)
    block_of = torch.arange(nb * b, device=ctx.device) // b
    own = (block_of[:, None] == block_of[None, :]).expand(r, -1, -1)  # (R, Q, Q)
    return torch.cat([ctx, own], dim=-1)


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


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding. x (..., T, D), positions (..., T) broadcastable."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    )
    angles = positions.to(torch.float32)[..., None] * inv_freq  # (..., T, D/2)
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1).to(x.dtype)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, spec: DraftSpec, in_dim: int | None = None) -> None:
        super().__init__()
        d, h, kv, hd = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        i = in_dim or d  # EAGLE-3 reads a 2d-wide [embedding ; hidden] input
        self.h, self.kv, self.hd, self.theta = h, kv, hd, spec.rope_theta
        self.q_proj = nn.Linear(i, h * hd, bias=False)
        self.k_proj = nn.Linear(i, kv * hd, bias=False)
        self.v_proj = nn.Linear(i, kv * hd, bias=False)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, spec.rms_norm_eps)
        self.k_norm = RMSNorm(hd, spec.rms_norm_eps)

    def _kv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # x (R, T, d), positions (R, T) -> k, v (R, h, T, hd) with GQA heads repeated
        r, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(r, t, self.kv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(r, t, self.kv, self.hd).transpose(1, 2)
        k = rope(k, positions[:, None, :], self.theta)
        rep = self.h // self.kv
        return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

    def forward(
        self,
        x: torch.Tensor,  # (R, Q, d) block tokens, already normed
        positions: torch.Tensor,  # (R, Q)
        ctx: torch.Tensor,  # (R, Tc, d) fused context (hidden_norm(fc(features)))
        ctx_positions: torch.Tensor,  # (R, Tc)
        ctx_mask: torch.Tensor,  # (R, Q, Tc) bool
        block_size: int,
    ) -> torch.Tensor:
        r, q_len, _ = x.shape
        nb = q_len // block_size
        q = self.q_norm(self.q_proj(x).view(r, q_len, self.h, self.hd)).transpose(1, 2)
        q = rope(q, positions[:, None, :], self.theta)  # (R, h, Q, hd)
        k_blk, v_blk = self._kv(x, positions)  # (R, h, Q, hd)
        k_ctx, v_ctx = self._kv(ctx, ctx_positions)  # (R, h, Tc, hd)
        scale = self.hd**-0.5
        s_ctx = (q @ k_ctx.transpose(-1, -2)) * scale  # (R, h, Q, Tc)
        s_ctx = s_ctx.masked_fill(~ctx_mask[:, None], float("-inf"))
        qb = q.view(r, self.h, nb, block_size, self.hd)
        kb = k_blk.view(r, self.h, nb, block_size, self.hd)
        vb = v_blk.view(r, self.h, nb, block_size, self.hd)
        s_blk = (qb @ kb.transpose(-1, -2)) * scale  # (R, h, Nb, B, B)
        s_blk = s_blk.reshape(r, self.h, q_len, block_size)
        p = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1).float(), dim=-1).to(q.dtype)
        p_ctx, p_blk = p[..., : s_ctx.shape[-1]], p[..., s_ctx.shape[-1] :]
        out = p_ctx @ v_ctx  # (R, h, Q, hd)
        out = out + (p_blk.view(r, self.h, nb, block_size, block_size) @ vb).view_as(out)
        return self.o_proj(out.transpose(1, 2).reshape(r, q_len, self.h * self.hd))


class MLP(nn.Module):
    def __init__(self, spec: DraftSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TargetHeadDraft(nn.Module):
    """Base of every draft: the target's embeddings and lm_head, frozen (module docstring)."""

    def __init__(self, spec: DraftSpec, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__()
        self.spec = spec
        self.register_buffer("embed_tokens", embed.detach().clone(), persistent=False)
        self.register_buffer("lm_head", lm_head.detach().clone(), persistent=False)

    def target_logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """The target's logits rebuilt from its post-norm final hidden state."""
        return last_hidden.to(self.lm_head.dtype) @ self.lm_head.T


def load_target_head(target_dir: str | Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens (V, H), lm_head (V, H)) from a HF checkpoint's safetensors."""
    from safetensors import safe_open

    target_dir = Path(target_dir)
    files = sorted(target_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{target_dir}: no *.safetensors files (need embeddings and lm_head)"
        )
    found: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name in ("model.embed_tokens.weight", "lm_head.weight"):
                    found[name] = f.get_tensor(name).float()
    if "model.embed_tokens.weight" not in found:
        raise ValueError(f"{target_dir}: model.embed_tokens.weight not found in {files}")
    embed = found["model.embed_tokens.weight"]
    head = found.get("lm_head.weight", embed)  # tied embeddings
    return embed, head


def tokenizer_mask_token_id(target_dir: str | Path) -> int:
    """The mask token of the target's tokenizer (what mask slots embed by default)."""
    from transformers import AutoTokenizer

    mask_id = AutoTokenizer.from_pretrained(target_dir).mask_token_id
    if mask_id is None:
        raise ValueError(
            f"{target_dir}: the tokenizer has no mask token; set draft.mask_token_id "
            "to an id whose embedding the draft may use for mask slots"
        )
    return mask_id
