"""The DSpark draft (DESIGN.md §6) and its DFlash baseline, in one readable file.

Backbone (DFlash): the k captured target layers of every context token are
concatenated, projected (`fc: k*H -> d`) and normed (`hidden_norm`); each draft
layer turns them into extra keys/values (its own k/v projections, k-norm and
RoPE at the context positions, no input norm: exactly what vLLM's
`precompute_and_store_context_kv` does). A block of `[anchor, MASK x (B-1)]`
at positions a..a+B-1 attends to the context tokens before its anchor and
bidirectionally to itself. Embeddings and `lm_head` are the target's, frozen.

DSpark adds a Markov logit-bias head `W2(W1[prev])` (W2 zero at init, so the
logits start equal to the DFlash path's) and a confidence head
`sigmoid(w . [h ; W1[prev]] + b)`. Parameter names are vLLM's checkpoint names
(`fc`, `hidden_norm`, `layers.{i}.self_attn.q_proj`, `markov_head.markov_w1`,
...), so export is a plain state-dict copy.

Attention runs in two parts: the context part is one masked matmul over the
row's context, the block part a batched (B x B) matmul per block; both share
one softmax. That avoids materialising the (Q x Q) block-diagonal mask and
runs the same on CPU and GPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class DraftSpec:
    """The resolved draft architecture: target shapes + DraftConfig choices."""

    kind: str  # "dspark" | "dflash" | "eagle3" (pipeline/train/eagle3.py)
    vocab_size: int  # target vocabulary (embedding rows)
    hidden_size: int  # d == target hidden size (embeddings and lm_head are shared)
    target_hidden_size: int  # H of the captured target layers
    aux_layer_ids: tuple[int, ...]  # vLLM convention: stream after k decoder layers
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    block_size: int
    mask_token_id: int
    sample_from_anchor: bool
    markov_rank: int  # 0: no Markov head (dflash)
    confidence_head: bool
    confidence_with_markov: bool

    @property
    def first_offset(self) -> int:
        """Offset from the anchor of the token slot 0 predicts (0: slot 0 predicts nothing)."""
        return 1 if self.sample_from_anchor else 0

    @property
    def num_draft_tokens(self) -> int:
        """Tokens drafted per block (vLLM's num_speculative_tokens)."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "aux_layer_ids": list(self.aux_layer_ids)}, indent=2)

    @classmethod
    def from_json(cls, text: str) -> DraftSpec:
        data = json.loads(text)
        return cls(**{**data, "aux_layer_ids": tuple(data["aux_layer_ids"])})


def resolve_spec(target_dir: str | Path, draft, aux_layer_ids, mask_token_id: int) -> DraftSpec:
    """Fill the DraftConfig's unset sizes from the target's config.json."""
    cfg = json.loads((Path(target_dir) / "config.json").read_text())
    rope = cfg.get("rope_parameters") or {}
    hidden = cfg["hidden_size"]
    heads = draft.num_heads or cfg["num_attention_heads"]
    dspark = draft.kind == "dspark"
    return DraftSpec(
        kind=draft.kind,
        vocab_size=cfg["vocab_size"],
        hidden_size=hidden,
        target_hidden_size=hidden,
        aux_layer_ids=tuple(int(i) for i in aux_layer_ids),
        num_layers=draft.num_layers,
        num_heads=heads,
        num_kv_heads=draft.num_kv_heads or cfg.get("num_key_value_heads", heads),
        head_dim=draft.head_dim or cfg.get("head_dim") or hidden // heads,
        intermediate_size=draft.intermediate_size or cfg["intermediate_size"],
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 1e6))),
        max_position_embeddings=cfg.get("max_position_embeddings", 32768),
        block_size=draft.block_size,
        mask_token_id=mask_token_id,
        sample_from_anchor=draft.anchor_predicts,
        markov_rank=draft.markov_rank if dspark else 0,
        confidence_head=dspark and draft.confidence_head,
        confidence_with_markov=draft.confidence_with_markov,
    )


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


class DecoderLayer(nn.Module):
    def __init__(self, spec: DraftSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec)

    def forward(self, x, positions, ctx, ctx_positions, ctx_mask, block_size):
        h = self.self_attn(
            self.input_layernorm(x), positions, ctx, ctx_positions, ctx_mask, block_size
        )
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """Vanilla rank-r logit bias from the previous token: W2(W1[prev])."""

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)  # (V, r)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)  # weight (V, r)


class ConfidenceHead(nn.Module):
    def __init__(self, in_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_dim, 1, bias=True)


class DraftModel(nn.Module):
    """DSpark (or DFlash when spec.markov_rank == 0) draft; see the module docstring."""

    def __init__(self, spec: DraftSpec, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__()
        self.spec = spec
        d = spec.hidden_size
        self.fc = nn.Linear(len(spec.aux_layer_ids) * spec.target_hidden_size, d, bias=False)
        self.hidden_norm = RMSNorm(d, spec.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(d, spec.rms_norm_eps)
        self.markov_head = (
            MarkovHead(spec.vocab_size, spec.markov_rank) if spec.markov_rank else None
        )
        self.confidence_head = None
        if spec.confidence_head:
            extra = spec.markov_rank if spec.confidence_with_markov else 0
            self.confidence_head = ConfidenceHead(d + extra)
        # The target's, frozen: buffers, so neither the optimiser, DDP nor
        # checkpoints carry them.
        self.register_buffer("embed_tokens", embed.detach().clone(), persistent=False)
        self.register_buffer("lm_head", lm_head.detach().clone(), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
        if self.markov_head is not None:
            nn.init.zeros_(self.markov_head.markov_w2.weight)  # logits start as DFlash's
        if self.confidence_head is not None:
            nn.init.zeros_(self.confidence_head.proj.weight)

    def target_logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """The target's logits rebuilt from its post-norm final hidden state."""
        return last_hidden.to(self.lm_head.dtype) @ self.lm_head.T

    def forward(self, inputs: DraftInputs) -> DraftOutput:
        spec = self.spec
        r, nb, b = inputs.block_ids.shape
        dtype = self.fc.weight.dtype
        ctx = self.hidden_norm(self.fc(inputs.ctx_features.to(dtype)))  # (R, Tc, d)
        positions = (inputs.block_anchor[:, :, None] + torch.arange(b, device=ctx.device)).view(
            r, nb * b
        )  # (R, Q)
        x = F.embedding(inputs.block_ids.view(r, nb * b), self.embed_tokens).to(dtype)  # (R, Q, d)
        mask = context_mask(inputs).repeat_interleave(b, dim=1)  # (R, Q, Tc)
        for layer in self.layers:
            x = layer(x, positions, ctx, inputs.ctx_positions, mask, b)
        hidden = self.norm(x).view(r, nb, b, -1)  # (R, Nb, B, d)
        base = hidden @ self.lm_head.T.to(hidden.dtype)  # (R, Nb, B, V)
        logits = base
        markov = None
        if self.markov_head is not None:
            markov = self.markov_head.markov_w1(inputs.prev_ids)  # (R, Nb, B, r)
            logits = base + self.markov_head.markov_w2(markov)
        confidence = None
        if self.confidence_head is not None:
            feats = (
                hidden
                if markov is None or not spec.confidence_with_markov
                else torch.cat([hidden, markov], dim=-1)
            )
            confidence = self.confidence_head.proj(feats.float()).squeeze(-1)  # (R, Nb, B)
        return DraftOutput(
            logits=logits, base_logits=base, hidden=hidden, confidence_logit=confidence
        )

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint and an export carry (vLLM's names)."""
        return {k: v for k, v in self.state_dict().items()}


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


def num_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
