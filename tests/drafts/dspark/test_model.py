"""The draft model: block attention (every implementation) against brute force, the Markov
bias, the references' init, frozen target parts."""

from __future__ import annotations

import math

import pytest
import torch
from draft_specs import tiny_spec

from pipeline.drafts.block_mask import block_attention_mask, build_block_mask
from pipeline.drafts.dspark.model import DSparkDraft, slot_weights
from pipeline.drafts.inputs import DraftInputs


def _inputs(spec, seed: int = 0) -> DraftInputs:
    """Two rows: row 0 packs two samples (lengths 7 and 5), row 1 one sample + padding."""
    g = torch.Generator().manual_seed(seed)
    b = spec.block_size
    tc, nb = 12, 4
    kh = len(spec.aux_layer_ids) * spec.target_hidden_size
    ctx_doc = torch.tensor([[0] * 7 + [1] * 5, [0] * 9 + [-1] * 3])
    ctx_pos = torch.tensor([list(range(7)) + list(range(5)), list(range(9)) + [0] * 3])
    block_doc = torch.tensor([[0, 0, 1, 1], [0, 0, -1, -1]])
    block_anchor = torch.tensor([[2, 5, 0, 3], [4, 8, 0, 0]])
    ids = torch.randint(4, spec.vocab_size, (2, nb, b), generator=g)
    ids[:, :, 1:] = spec.mask_token_id
    return DraftInputs(
        ctx_features=torch.randn(2, tc, kh, generator=g),
        ctx_positions=ctx_pos,
        ctx_doc=ctx_doc,
        block_ids=ids,
        block_anchor=block_anchor,
        block_doc=block_doc,
        prev_ids=torch.randint(4, spec.vocab_size, (2, nb, b), generator=g),
    )


def _model(spec, seed: int = 0) -> DSparkDraft:
    torch.manual_seed(seed)
    embed = torch.randn(spec.vocab_size, spec.hidden_size)
    head = torch.randn(spec.vocab_size, spec.hidden_size)
    return DSparkDraft(spec, embed, head)


def test_block_mask_equals_brute_force():
    spec = tiny_spec()
    inputs = _inputs(spec)
    mask = block_attention_mask(inputs)
    r, nb, b = inputs.block_ids.shape
    tc = inputs.ctx_doc.shape[1]
    assert mask.shape == (r, nb * b, tc + nb * b)
    for row in range(r):
        for q in range(nb * b):
            blk = q // b
            doc, anchor = int(inputs.block_doc[row, blk]), int(inputs.block_anchor[row, blk])
            for k in range(tc + nb * b):
                if k < tc:
                    want = (
                        doc >= 0
                        and int(inputs.ctx_doc[row, k]) == doc
                        and int(inputs.ctx_positions[row, k]) < anchor
                    )
                else:
                    want = (k - tc) // b == blk  # own block, both directions
                assert bool(mask[row, q, k]) == want, (row, q, k)
    # Spot checks of the semantics: block (0,1) with anchor 5 of sample 0 sees ctx 0..4 only.
    assert mask[0, b, :7].tolist() == [True] * 5 + [False] * 2
    assert not mask[0, b, 7:12].any()  # never the other packed sample


def _brute_attention(attn, x, positions, ctx, ctx_pos, inputs, b):
    """Per block: gather its visible keys explicitly and run plain softmax attention."""
    r, q_len, _ = x.shape
    out = torch.zeros(r, q_len, attn.h * attn.hd)
    scale = attn.hd**-0.5
    rep = attn.h // attn.kv
    for row in range(r):
        for blk in range(q_len // b):
            sl = slice(blk * b, (blk + 1) * b)
            xq = x[row, sl]
            q = attn.q_norm(attn.q_proj(xq).view(b, attn.h, attn.hd)).transpose(0, 1)
            q = attn.rotate(q, positions[row, sl][None])
            doc, anchor = int(inputs.block_doc[row, blk]), int(inputs.block_anchor[row, blk])
            sel = (inputs.ctx_doc[row] == doc) & (inputs.ctx_positions[row] < anchor) & (doc >= 0)
            keys_src = torch.cat([ctx[row, sel], xq])
            key_pos = torch.cat([ctx_pos[row, sel], positions[row, sl]])
            n = keys_src.shape[0]
            k = attn.k_norm(attn.k_proj(keys_src).view(n, attn.kv, attn.hd)).transpose(0, 1)
            k = attn.rotate(k, key_pos[None]).repeat_interleave(rep, 0)
            v = attn.v_proj(keys_src).view(n, attn.kv, attn.hd).transpose(0, 1)
            v = v.repeat_interleave(rep, 0)
            p = torch.softmax((q @ k.transpose(-1, -2)) * scale, -1)
            out[row, sl] = (p @ v).transpose(0, 1).reshape(b, -1)
    return attn.o_proj(out)


@pytest.mark.parametrize("attention", ["sdpa", "eager", "flex"])
def test_attention_equals_brute_force_per_block(attention):
    spec = tiny_spec()
    model = _model(spec)
    inputs = _inputs(spec)
    r, nb, b = inputs.block_ids.shape
    attn = model.layers[0].self_attn
    x = torch.randn(r, nb * b, spec.hidden_size)
    positions = (inputs.block_anchor[:, :, None] + torch.arange(b)).view(r, nb * b)
    ctx = torch.randn(r, inputs.ctx_doc.shape[1], spec.hidden_size)
    with torch.no_grad():  # flex_attention has no CPU backward; the others are checked below
        got = attn(x, positions, ctx, inputs.ctx_positions, build_block_mask(inputs, attention))
        want = _brute_attention(attn, x, positions, ctx, inputs.ctx_positions, inputs, b)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sdpa_and_eager_models_agree_with_gradients():
    """The fused path computes the reference's function and its gradients."""
    spec = tiny_spec()
    inputs = _inputs(spec)
    grads = {}
    for attention in ("sdpa", "eager"):
        model = _model(spec)
        model.attention = attention
        out = model(inputs)
        out.logits.pow(2).mean().backward()
        grads[attention] = (out.logits.detach(), model.layers[0].self_attn.q_proj.weight.grad)
    torch.testing.assert_close(grads["sdpa"][0], grads["eager"][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads["sdpa"][1], grads["eager"][1], atol=1e-5, rtol=1e-4)


def test_markov_bias_is_added_to_the_dflash_logits():
    """DSpark logits = the DFlash backbone's + W2(W1[prev]), exactly; the heads start
    from the references' normal init (std 0.02), not from zero."""
    dspark = _model(tiny_spec())
    dflash = _model(tiny_spec(kind="dflash", markov_rank=0, confidence_head=False))
    missing, unexpected = dflash.load_state_dict(dspark.state_dict(), strict=False)
    assert not missing
    assert {k.split(".")[0] for k in unexpected} == {"markov_head", "confidence_head"}
    inputs = _inputs(tiny_spec())
    with torch.no_grad():
        out_s, out_f = dspark(inputs), dflash(inputs)
        bias = dspark.markov_head.markov_w2(dspark.markov_head.markov_w1(inputs.prev_ids))
    torch.testing.assert_close(out_s.base_logits, out_f.logits, atol=0, rtol=0)
    torch.testing.assert_close(out_s.logits, out_f.logits + bias, atol=1e-6, rtol=1e-6)
    assert out_f.confidence_logit is None
    w2 = dspark.markov_head.markov_w2.weight
    conf = dspark.confidence_head.proj
    assert 0.015 < float(w2.std()) < 0.025 and 0.01 < float(conf.weight.std()) < 0.03
    assert float(conf.bias.abs().max()) == 0.0
    # Without the logits (the trainer's chunked loss), the same hidden states and inputs.
    lean = dspark(inputs, with_logits=False)
    assert lean.logits is None and lean.base_logits is None
    torch.testing.assert_close(dspark.output_logits(lean.hidden, lean.markov), out_s.logits)


def test_target_parts_frozen_and_not_saved():
    spec = tiny_spec()
    model = _model(spec)
    names = {n for n, _ in model.named_parameters()}
    assert "embed_tokens" not in names and "lm_head" not in names
    assert not any("embed_tokens" in k or "lm_head" in k for k in model.state_dict())
    out = model(_inputs(spec))
    out.logits.sum().backward()
    assert model.fc.weight.grad is not None and model.fc.weight.grad.abs().sum() > 0
    assert "layers.1.self_attn.q_proj.weight" in model.state_dict()
    assert out.logits.shape == (2, 4, spec.block_size, spec.vocab_size)


def test_slot_weights_decay_and_skip_nonpredicting_slot():
    w = slot_weights(block_size=4, first_offset=1, gamma=4.0)
    assert torch.allclose(w, torch.tensor([1.0, math.exp(-0.25), math.exp(-0.5), math.exp(-0.75)]))
    w0 = slot_weights(block_size=4, first_offset=0, gamma=4.0)
    assert w0[0] == 0 and torch.allclose(w0[1:], w[:3])
