"""What every draft kind shares: its inputs and outputs, Qwen3 building blocks, the target head.

`DraftInputs` is one packed batch as a draft sees it (pipeline/train/packing.py
packs it, the evaluators build it per sample); `DraftOutput` is what a
draft's forward returns. `Attention` holds the Qwen3 projections (q/k norms,
RoPE with the target's scaling, GQA) and the DSpark block attention; EAGLE-3
reuses its projections. `TargetHeadDraft` is the base of every draft: the
target's embeddings and lm_head, frozen, as non-persistent buffers (neither
the optimiser nor checkpoints carry them; the trainer keeps DDP from
broadcasting them), stored in the training precision (bf16 for a bf16 run:
1.6 GB instead of 3.1 for two 151,936 x 2560 tables, a 4B target's), and the target logits
rebuilt from a stored post-norm final hidden state.

Block attention (`attention`, one of `ATTENTION`): a block's queries attend
to the context slots before its anchor (same sample) and to their own block.

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
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.drafts.spec import DraftSpec

log = logging.getLogger(__name__)


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


ATTENTION = ("sdpa", "flex", "eager")


@dataclass
class DraftOutput:
    # (R, Nb, B, V) draft logits incl. the Markov bias; None when the forward ran
    # with `with_logits=False` (training: the loss builds logits chunk by chunk).
    logits: torch.Tensor | None
    base_logits: torch.Tensor | None  # (R, Nb, B, V) the backbone alone (DFlash path)
    hidden: torch.Tensor  # (R, Nb, B, d) after the final norm
    confidence_logit: torch.Tensor | None  # (R, Nb, B) pre-sigmoid acceptance estimate
    markov: torch.Tensor | None = None  # (R, Nb, B, r) W1[prev]: the Markov head's input


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


EMBED_NAMES = (
    "model.embed_tokens.weight",
    "model.language_model.embed_tokens.weight",  # multimodal (Gemma-3, transformers 5)
    "language_model.model.embed_tokens.weight",  # multimodal (transformers 4)
)
LM_HEAD_NAMES = ("lm_head.weight", "language_model.lm_head.weight")


def load_target_head(
    target_dir: str | Path, dtype: torch.dtype | None = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens (V, H), lm_head (V, H)) from a HF checkpoint's safetensors, in
    `dtype` (None: as stored). A tied lm_head is the embedding tensor itself."""
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
                if name in EMBED_NAMES or name in LM_HEAD_NAMES:
                    tensor = f.get_tensor(name)
                    found[name] = tensor if dtype is None else tensor.to(dtype)
    embed = next((found[n] for n in EMBED_NAMES if n in found), None)
    if embed is None:
        raise ValueError(f"{target_dir}: none of {list(EMBED_NAMES)} found in {files}")
    head = next((found[n] for n in LM_HEAD_NAMES if n in found), embed)  # tied embeddings
    return embed, head


def tokenizer_mask_token_id(target_dir: str | Path) -> int:
    """The token mask slots embed by default: the tokenizer's mask token, else a fallback.

    Many real targets (Llama, Qwen, SmolLM) have no mask token. Then, as the
    field's trainers do (docs/train.md): the first embedding row no tokenizer
    token uses (the table is often padded past the tokenizer), else the pad,
    EOS or unknown token. The draft only needs a fixed row it learns to read
    as "not drafted yet"; the id goes into the checkpoint and the export, so
    vLLM feeds the same one.
    """
    import logging

    from transformers import AutoTokenizer

    from pipeline.targets.resolve import text_config

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    vocab_size = int(text_config(str(target_dir)).vocab_size)
    candidates = [("mask token", tokenizer.mask_token_id)]
    if len(tokenizer) < vocab_size:
        candidates.append(("first unused embedding row", len(tokenizer)))
    candidates += [
        ("pad token", tokenizer.pad_token_id),
        ("EOS token", tokenizer.eos_token_id),
        ("unknown token", tokenizer.unk_token_id),
    ]
    for source, token_id in candidates:
        if token_id is not None and 0 <= int(token_id) < vocab_size:
            if source != "mask token":
                logging.getLogger(__name__).info(
                    "no mask token in %s: mask slots embed the %s, id %d",
                    target_dir,
                    source,
                    token_id,
                )
            return int(token_id)
    raise ValueError(
        f"{target_dir}: the tokenizer has no mask, pad, EOS or unknown token and the "
        "embedding table no unused row; set draft.mask_token_id"
    )
