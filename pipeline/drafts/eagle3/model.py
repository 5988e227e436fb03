"""The EAGLE-3 baseline: one draft layer, trained with the training-time test (TTT).

What vLLM's `eagle3` method runs (`qwen3_eagle3.py`, `llm_base_proposer.py`),
and therefore what this module trains, for a root position p (the last token
the target has processed; x_{p+1} is the token it just sampled):

* the k captured target layers of every position j are concatenated and
  projected, `h_j = fc(g_j)` (k*H -> H); aux ids follow the capture
  convention unchanged (vLLM does not shift them for eagle3);
* step 0 runs the layer on `[input_layernorm(embed(x_{j+1})) ; hidden_norm(h_j)]`
  (2H wide; attention input and residual as in `Qwen3Eagle3DecoderLayer` with
  `norm_before_residual: false`, the EAGLE-3 reference) at position j, for every
  j <= p: those are the draft's KV cache; the output at p gives draft token 1;
* step s >= 1 feeds the previous step's token and its *pre-norm* output
  (`hidden + residual`, vLLM's `aux_output`) at position p+s; its query sees the
  step-0 keys of positions <= p and the keys of its own steps 1..s;
* logits = frozen lm_head(norm(output)) (target's lm_head and embeddings are
  shared, not exported).

Training layout: the data pipeline's blocks in the `sample_from_anchor` layout
with block_size = the number of unrolled steps (7). Anchor a = p+1; slot s is
TTT step s and drafts x_{a+s+1}; its input token is `prev_ids[..., s]` = x_{a+s}.
Inputs are teacher-forced (the data is the target's own greedy output, and at
T=0 step s only counts when steps < s matched the target, i.e. when the draft's
tokens *were* these), hidden states are the draft's own (that is the TTT part,
as in the EAGLE-3 reference). Context keys are a pure projection of the layer
input (one layer), so they are computed once for all context slots; the step
loop (K steps) then attends to them and to the block's own chain keys.

Loss (pipeline/train/loss.py): sum_s 0.8**s * KL(p_target || p_draft) at each
valid step, p_target = softmax(lm_head(last_hidden[a+s])) from the stored
post-norm final hidden state. EAGLE-3's reference writes it as
-sum p_target log p_draft (soft-label CE); the KL differs by the target's
entropy only (same gradient). Normalised by the summed step weights.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from pipeline.drafts.block_mask import context_mask
from pipeline.drafts.common import MLP, Attention, RMSNorm, TargetHeadDraft
from pipeline.drafts.inputs import DraftInputs, DraftOutput
from pipeline.drafts.spec import DraftSpec


def ttt_step_weights(*, num_steps: int, decay: float) -> torch.Tensor:
    """(num_steps,) EAGLE-3 loss weight of unrolled step s (0-based): decay**s (0.8 in EAGLE-3)."""
    return decay ** torch.arange(num_steps, dtype=torch.float32)


class Eagle3Attention(Attention):
    """Qwen3 attention whose q/k/v read the 2H-wide [embedding ; hidden] input."""

    def __init__(self, spec: DraftSpec) -> None:
        super().__init__(spec, in_dim=2 * spec.hidden_size)

    def query(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x (R, N, 2d), positions (R, N) -> (R, h, N, hd)
        r, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(r, n, self.h, self.hd)).transpose(1, 2)
        return self.rotate(q, positions[:, None, :])

    def key_value(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (R, h, N, hd) with GQA heads repeated."""
        return self._kv(x, positions)

    def attend(
        self,
        q: torch.Tensor,  # (R, h, Nb, hd) one query per block (this step)
        k_ctx: torch.Tensor,  # (R, h, Tc, hd) step-0 keys of the context
        v_ctx: torch.Tensor,  # (R, h, Tc, hd)
        ctx_mask: torch.Tensor,  # (R, Nb, Tc) bool
        k_chain: torch.Tensor,  # (R, h, Nb, S, hd) this block's own keys, steps 0..s
        v_chain: torch.Tensor,  # (R, h, Nb, S, hd)
    ) -> torch.Tensor:
        r, _, nb, _ = q.shape
        scale = self.hd**-0.5
        s_ctx = (q @ k_ctx.transpose(-1, -2)) * scale  # (R, h, Nb, Tc)
        s_ctx = s_ctx.masked_fill(~ctx_mask[:, None], float("-inf"))
        s_chain = (q[..., None, :] * k_chain).sum(-1) * scale  # (R, h, Nb, S)
        p = torch.softmax(torch.cat([s_ctx, s_chain], dim=-1).float(), dim=-1).to(q.dtype)
        tc = s_ctx.shape[-1]
        out = p[..., :tc] @ v_ctx + (p[..., tc:, None] * v_chain).sum(-2)  # (R, h, Nb, hd)
        return self.o_proj(out.transpose(1, 2).reshape(r, nb, self.h * self.hd))


class Eagle3Layer(nn.Module):
    """vLLM's `Qwen3Eagle3DecoderLayer` (layer 0, norm_before_residual false)."""

    def __init__(self, spec: DraftSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)  # on embeddings
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)  # on hidden states
        self.self_attn = Eagle3Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec)

    def layer_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """(.., d), (.., d) -> (.., 2d): [input_layernorm(embeds) ; hidden_norm(hidden)]."""
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual stream after attention and MLP (pre-norm: what the next step reads)."""
        x = hidden + attn_out
        return x + self.mlp(self.post_attention_layernorm(x))


def ttt_context_mask(inputs: DraftInputs) -> torch.Tensor:
    """(R, Nb, Tc) bool: every step of block n sees the step-0 key of context slot j
    iff same sample and position < a-1 (the root p = a-1 itself is the block's
    own step-0 key, which the step loop carries with the chain)."""
    return context_mask(dataclasses.replace(inputs, block_anchor=inputs.block_anchor - 1))


def ttt_attention_mask(inputs: DraftInputs) -> torch.Tensor:
    """(R, Nb, K, Tc + K) bool: what step s of block n attends to, over
    [context step-0 keys ; the block's own keys of steps 0..K-1].

    For tests and inspection; the model uses the context part and the causal
    chain part separately."""
    r, nb, k = inputs.block_ids.shape
    ctx = ttt_context_mask(inputs)[:, :, None, :].expand(r, nb, k, -1)
    chain = torch.ones(k, k, dtype=torch.bool, device=ctx.device).tril()  # step s sees 0..s
    return torch.cat([ctx, chain.expand(r, nb, k, k)], dim=-1)


def next_context_ids(inputs: DraftInputs) -> torch.Tensor:
    """(R, Tc): the token after each context slot in its own sample (0 at the end)."""
    ids, doc = inputs.ctx_ids, inputs.ctx_doc
    nxt = torch.zeros_like(ids)
    nxt[:, :-1] = torch.where(doc[:, 1:] == doc[:, :-1], ids[:, 1:], 0)
    return nxt


def root_slots(inputs: DraftInputs) -> torch.Tensor:
    """(R, Nb) context slot of each block's root p = a-1 (0 for padding blocks).

    Anchors are answer tokens, so a >= 1 whenever the prompt is not empty."""
    hit = (inputs.ctx_doc[:, None, :] == inputs.block_doc[:, :, None]) & (
        inputs.ctx_positions[:, None, :] == (inputs.block_anchor - 1)[:, :, None]
    )  # (R, Nb, Tc)
    return hit.to(torch.int8).argmax(-1)


class Eagle3Draft(TargetHeadDraft):
    """EAGLE-3 draft; tensor names are the speculators/vLLM names (`fc`, `layers.0.*`, `norm`)."""

    def __init__(
        self,
        spec: DraftSpec,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        frozen_dtype: torch.dtype | None = None,
    ) -> None:
        if spec.num_layers != 1:
            raise ValueError(f"the EAGLE-3 baseline has one layer, spec has {spec.num_layers}")
        super().__init__(spec, embed, lm_head, frozen_dtype)
        d = spec.hidden_size
        self.fc = nn.Linear(len(spec.aux_layer_ids) * spec.target_hidden_size, d, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(spec)])
        self.norm = RMSNorm(d, spec.rms_norm_eps)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, inputs: DraftInputs, *, with_logits: bool = True) -> DraftOutput:
        """Teacher-forced unroll (training): step s reads `prev_ids[..., s]` = x_{a+s}.
        `with_logits=False` skips the (R, Nb, K, V) logits (the chunked loss builds them)."""
        normed, logits, _ = self.unroll(inputs, with_logits=with_logits)
        return DraftOutput(logits=logits, base_logits=logits, hidden=normed, confidence_logit=None)

    def unroll(
        self,
        inputs: DraftInputs,
        *,
        free_running: bool = False,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
        with_logits: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(normed (R,Nb,K,d), logits (R,Nb,K,Vd), tokens (R,Nb,K)) of the K-step loop
        (Vd: the draft vocabulary; tokens are target ids).

        Teacher-forced by default. `free_running=True` is what vLLM serves:
        step 0 reads the anchor (`prev_ids[..., 0]`), step s >= 1 the token
        the draft itself chose at step s-1 (argmax at temperature 0, else a
        sample from softmax(logits / T)). `tokens` are the tokens chosen at
        each step (argmax when teacher-forced). Teacher-forced with
        `with_logits=False`, logits and tokens are None (nothing reads them)."""
        if inputs.ctx_ids is None:
            raise ValueError("EAGLE-3 needs DraftInputs.ctx_ids (the context tokens)")
        steps = inputs.block_ids.shape[2]
        layer, attn = self.layers[0], self.layers[0].self_attn
        dtype = self.fc.weight.dtype
        fused = self.fc(inputs.ctx_features.to(dtype))  # (R, Tc, d)
        ctx_emb = self.embed(next_context_ids(inputs), dtype)
        k_ctx, v_ctx = attn.key_value(
            layer.layer_input(ctx_emb, fused), inputs.ctx_positions
        )  # (R, h, Tc, hd)
        ctx_mask = ttt_context_mask(inputs)  # (R, Nb, Tc)
        root = root_slots(inputs)  # (R, Nb)
        hidden = fused.gather(1, root[..., None].expand(-1, -1, fused.shape[-1]))  # (R, Nb, d)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        normed, logits, chosen = [], [], []
        tokens = inputs.prev_ids[:, :, 0]  # (R, Nb) the anchor x_a
        for s in range(steps):
            if s and not free_running:
                tokens = inputs.prev_ids[:, :, s]  # token a+s, teacher-forced
            x = layer.layer_input(self.embed(tokens, dtype), hidden)
            positions = inputs.block_anchor - 1 + s  # (R, Nb) = p + s
            q = attn.query(x, positions)  # (R, h, Nb, hd)
            k, v = attn.key_value(x, positions)
            keys.append(k)
            values.append(v)
            out = attn.attend(
                q, k_ctx, v_ctx, ctx_mask, torch.stack(keys, dim=3), torch.stack(values, dim=3)
            )
            hidden = layer.finish(hidden, out)  # (R, Nb, d) pre-norm, fed to step s+1
            normed.append(self.norm(hidden))
            if not (with_logits or free_running):
                continue
            logits.append(self.head_logits(normed[-1]))  # (R, Nb, Vd)
            if free_running and temperature > 0:
                p = torch.softmax(logits[-1].float() / temperature, dim=-1)
                tokens = torch.multinomial(p.flatten(0, 1), 1, generator=generator)
                tokens = tokens.view(p.shape[:2])
            else:
                tokens = logits[-1].argmax(-1)
            tokens = self.to_target_ids(tokens)  # a reduced vocabulary's ids -> target ids
            chosen.append(tokens)
        if not logits:
            return torch.stack(normed, 2), None, None
        return torch.stack(normed, 2), torch.stack(logits, 2), torch.stack(chosen, 2)
