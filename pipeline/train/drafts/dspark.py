"""The DSpark draft (DESIGN.md §6) and its DFlash baseline, in one readable file.

DFlash has no module of its own: it is this model with `markov_rank == 0`
and no confidence head (pipeline/train/drafts/registry.py says so).

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

The shared pieces (inputs, outputs, attention, MLP, the frozen target head)
are in pipeline/train/drafts/common.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.train.drafts.common import (
    MLP,
    Attention,
    DraftInputs,
    DraftOutput,
    RMSNorm,
    TargetHeadDraft,
    context_mask,
)
from pipeline.train.drafts.spec import DraftSpec


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


class DSparkDraft(TargetHeadDraft):
    """DSpark (or DFlash when spec.markov_rank == 0) draft; see the module docstring."""

    def __init__(self, spec: DraftSpec, embed: torch.Tensor, lm_head: torch.Tensor) -> None:
        super().__init__(spec, embed, lm_head)
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
