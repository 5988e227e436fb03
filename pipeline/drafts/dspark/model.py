"""The DSpark draft (docs/design.md#the-draft-dspark) and its DFlash baseline, in one readable file.

DFlash has no module of its own: it is this model with `markov_rank == 0`
and no confidence head (pipeline/drafts/registry.py says so).

Backbone (DFlash): the k captured target layers of every context token are
concatenated, projected (`fc: k*H -> d`) and normed (`hidden_norm`); each draft
layer turns them into extra keys/values (its own k/v projections, k-norm and
RoPE at the context positions, no input norm: exactly what vLLM's
`precompute_and_store_context_kv` does). A block of `[anchor, MASK x (B-1)]`
at positions a..a+B-1 attends to the context tokens before its anchor and
bidirectionally to itself. Embeddings and `lm_head` are the target's, frozen.

DSpark adds a Markov logit-bias head `W2(W1[prev])` and a confidence head
`sigmoid(w . [h ; W1[prev]] + b)`. Every weight starts as DeepSpec's
reference initialises it (its `post_init`: normal, std 0.02, biases zero),
the Markov output W2 and the confidence weights included (an earlier version
started them at zero; docs/train.md, "Recipe", and bench/RESULTS.md,
History). speculators 0.9.0 builds these two heads after its `post_init`:
W1 normal(0, 0.01), W2 and the confidence head torch's default uniform init. Parameter names are vLLM's checkpoint names
(`fc`, `hidden_norm`, `layers.{i}.self_attn.q_proj`, `markov_head.markov_w1`,
...), so export is a plain state-dict copy.

With a reduced draft vocabulary (spec.draft_vocab) the logits, the Markov
output W2 and the argmax are over the draft vocabulary; W1 and the confidence
head read the previous token as a target id, unchanged.

The shared pieces are in pipeline/drafts/: inputs and outputs (inputs.py),
attention and MLP (common.py), block masks (block_mask.py), the frozen target
head (target_head.py).
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.drafts.block_mask import BlockMask, build_block_mask
from pipeline.drafts.common import MLP, Attention, RMSNorm, TargetHeadDraft
from pipeline.drafts.inputs import DraftInputs, DraftOutput
from pipeline.drafts.spec import DraftSpec


def slot_weights(*, block_size: int, first_offset: int, gamma: float) -> torch.Tensor:
    """(B,) loss weight per block slot: exp(-(k-1)/gamma) with k = slot + first_offset
    (the 1-based index of the token the slot drafts); 0 if k < 1."""
    k = torch.arange(block_size, dtype=torch.float32) + first_offset
    w = torch.exp(-(k - 1) / gamma)
    return torch.where(k >= 1, w, torch.zeros_like(w))


class DecoderLayer(nn.Module):
    def __init__(self, spec: DraftSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec)

    def forward(self, x, positions, ctx, ctx_positions, mask: BlockMask):
        h = self.self_attn(self.input_layernorm(x), positions, ctx, ctx_positions, mask)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    """Vanilla rank-r logit bias from the previous token: W2(W1[prev]).

    W1 embeds the previous token, a target id (the anchor or a drafted token
    mapped back); W2 biases the draft's logits, over the draft vocabulary
    (vLLM's `DSparkMarkovHead`: `vocab_size` rows in, `draft_vocab_size` out)."""

    def __init__(self, vocab_size: int, rank: int, draft_vocab_size: int | None = None) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)  # (V, r)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size or vocab_size, bias=False)  # (Vd, r)


class ConfidenceHead(nn.Module):
    def __init__(self, in_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_dim, 1, bias=True)


class DSparkDraft(TargetHeadDraft):
    """DSpark (or DFlash when spec.markov_rank == 0) draft; see the module docstring."""

    def __init__(
        self,
        spec: DraftSpec,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        frozen_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(spec, embed, lm_head, frozen_dtype)
        d = spec.hidden_size
        self.fc = nn.Linear(len(spec.aux_layer_ids) * spec.target_hidden_size, d, bias=False)
        self.hidden_norm = RMSNorm(d, spec.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(d, spec.rms_norm_eps)
        self.markov_head = (
            MarkovHead(spec.vocab_size, spec.markov_rank, spec.draft_vocab_size)
            if spec.markov_rank
            else None
        )
        self.confidence_head = None
        if spec.confidence_head:
            extra = spec.markov_rank if spec.confidence_with_markov else 0
            self.confidence_head = ConfidenceHead(d + extra)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The references' init: normal(0.02) weights, zero biases, unit norms."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def output_logits(self, hidden: torch.Tensor, markov: torch.Tensor | None) -> torch.Tensor:
        """(..., d), (..., r) -> (..., Vd): backbone logits plus the Markov bias W2(markov)."""
        logits = self.head_logits(hidden)
        if self.markov_head is None or markov is None:
            return logits
        return logits + self.markov_head.markov_w2(markov.to(hidden.dtype))

    def forward(self, inputs: DraftInputs, *, with_logits: bool = True) -> DraftOutput:
        """The draft's outputs for a packed batch. `with_logits=False` skips the
        (R, Nb, B, V) logits (the trainer's chunked loss builds them from `hidden` and
        `markov`, a few rows at a time)."""
        spec = self.spec
        r, nb, b = inputs.block_ids.shape
        dtype = self.fc.weight.dtype
        ctx = self.hidden_norm(self.fc(inputs.ctx_features.to(dtype)))  # (R, Tc, d)
        positions = (inputs.block_anchor[:, :, None] + torch.arange(b, device=ctx.device)).view(
            r, nb * b
        )  # (R, Q)
        x = self.embed(inputs.block_ids.view(r, nb * b), dtype)  # (R, Q, d)
        mask = build_block_mask(inputs, self.attention)
        for layer in self.layers:
            x = layer(x, positions, ctx, inputs.ctx_positions, mask)
        hidden = self.norm(x).view(r, nb, b, -1)  # (R, Nb, B, d)
        markov = None
        if self.markov_head is not None:
            markov = self.markov_head.markov_w1(inputs.prev_ids)  # (R, Nb, B, r)
        confidence = None
        if self.confidence_head is not None:
            feats = (
                hidden
                if markov is None or not spec.confidence_with_markov
                else torch.cat([hidden, markov.to(hidden.dtype)], dim=-1)
            )
            confidence = self.confidence_head.proj(feats.float()).squeeze(-1)  # (R, Nb, B)
        base = logits = None
        if with_logits:
            base = self.head_logits(hidden)  # (R, Nb, B, V)
            logits = base if markov is None else self.output_logits(hidden, markov)
        return DraftOutput(
            logits=logits,
            base_logits=base,
            hidden=hidden,
            confidence_logit=confidence,
            markov=markov,
        )
