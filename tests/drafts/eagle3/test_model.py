"""The EAGLE-3 baseline: TTT unroll against a brute-force replay of vLLM's drafting
loop, the loss falling on toy shards, export in the speculators eagle3 format,
and real CPU vLLM serving it losslessly at temperature 0."""

from __future__ import annotations

import json
import math

import pytest
import torch
from draft_specs import tiny_spec, train_small_draft

from pipeline.drafts.eagle3.model import Eagle3Draft, ttt_attention_mask, ttt_step_weights
from pipeline.drafts.inputs import DraftInputs
from pipeline.train.config import parse_train_config
from pipeline.train.loss import draft_loss

from ..conftest import SERVE_MAX_TOKENS

STEPS = 4


def _spec():
    return tiny_spec(kind="eagle3", block_size=STEPS)


def _inputs(spec, seed: int = 0) -> DraftInputs:
    """Row 0 packs two samples (lengths 7 and 5), row 1 one sample (9) + padding."""
    g = torch.Generator().manual_seed(seed)
    tc, nb = 12, 4
    kh = len(spec.aux_layer_ids) * spec.target_hidden_size
    ctx_doc = torch.tensor([[0] * 7 + [1] * 5, [0] * 9 + [-1] * 3])
    ctx_pos = torch.tensor([list(range(7)) + list(range(5)), list(range(9)) + [0] * 3])
    ctx_ids = torch.randint(4, spec.vocab_size, (2, tc), generator=g)
    ctx_ids[1, 9:] = 0
    block_doc = torch.tensor([[0, 0, 1, 1], [0, 0, -1, -1]])
    block_anchor = torch.tensor([[1, 4, 2, 3], [5, 7, 0, 0]])
    prev = torch.randint(4, spec.vocab_size, (2, nb, STEPS), generator=g)
    for r in range(2):  # slot 0 reads the anchor token, as the data pipeline packs it
        for n in range(nb):
            d, a = int(block_doc[r, n]), int(block_anchor[r, n])
            if d >= 0:
                slot = int(((ctx_doc[r] == d) & (ctx_pos[r] == a)).nonzero())
                prev[r, n, 0] = ctx_ids[r, slot]
    return DraftInputs(
        ctx_features=torch.randn(2, tc, kh, generator=g),
        ctx_positions=ctx_pos,
        ctx_doc=ctx_doc,
        block_ids=prev.clone(),
        block_anchor=block_anchor,
        block_doc=block_doc,
        prev_ids=prev,
        ctx_ids=ctx_ids,
    )


def _model(spec, seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    model = Eagle3Draft(
        spec, torch.randn(spec.vocab_size, spec.hidden_size), torch.randn(spec.vocab_size, 32)
    )
    with torch.no_grad():  # non-trivial norms, so a swapped norm would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _replay(model: Eagle3Draft, inputs: DraftInputs, row: int, block: int) -> torch.Tensor:
    """(K, V) logits of one block, replaying vLLM's drafting loop token by token:
    a KV cache filled by the step-0 pass over positions 0..p (token j+1, features
    of j), then one decode step per drafted token at positions p+1, p+2, ..."""
    layer = model.layers[0]
    attn = layer.self_attn
    doc, a = int(inputs.block_doc[row, block]), int(inputs.block_anchor[row, block])
    slots = [int(i) for i in range(inputs.ctx_doc.shape[1]) if int(inputs.ctx_doc[row, i]) == doc]
    tokens = [int(inputs.ctx_ids[row, i]) for i in slots]
    feats = [inputs.ctx_features[row, i] for i in slots]
    p = a - 1

    def run(token: int, hidden: torch.Tensor, pos: int):
        x = layer.layer_input(model.embed_tokens[token], hidden)[None, None]  # (1, 1, 2d)
        positions = torch.tensor([[pos]])
        q = attn.query(x, positions)[0, :, 0]  # (h, hd)
        k, v = attn.key_value(x, positions)
        return q, k[0, :, 0], v[0, :, 0]

    cache = []  # (position, k (h, hd), v (h, hd))
    for j in range(p + 1):
        _, k, v = run(tokens[j + 1], model.fc(feats[j]), j)
        cache.append((j, k, v))
    hidden = model.fc(feats[p])
    token = tokens[p + 1]  # x_a: the token the target just sampled
    logits = []
    for s in range(STEPS):
        pos = p + s
        q, k, v = run(token, hidden, pos)
        if s > 0:  # step 0's own key is the cache entry at p
            cache.append((pos, k, v))
        assert [c[0] for c in cache] == list(range(pos + 1))  # causal, no gaps
        keys = torch.stack([c[1] for c in cache], 1)  # (h, n, hd)
        vals = torch.stack([c[2] for c in cache], 1)
        w = torch.softmax((keys @ q[:, :, None]).squeeze(-1) / math.sqrt(attn.hd), -1)  # (h, n)
        out = attn.o_proj((w[:, :, None] * vals).sum(1).reshape(-1))
        hidden = layer.finish(hidden, out)  # pre-norm, fed to the next step
        logits.append(model.norm(hidden) @ model.lm_head.T)
        if s + 1 < STEPS:
            token = int(inputs.prev_ids[row, block, s + 1])  # teacher-forced x_{a+s+1}
    return torch.stack(logits)


def test_ttt_unroll_equals_brute_force_replay():
    spec = _spec()
    inputs = _inputs(spec)
    model = _model(spec)
    with torch.no_grad():
        out = model(inputs)
    assert out.logits.shape == (2, 4, STEPS, spec.vocab_size)
    assert out.hidden.shape == (2, 4, STEPS, spec.hidden_size) and out.confidence_logit is None
    assert torch.isfinite(out.logits).all()  # padding blocks too (no empty softmax)
    with torch.no_grad():
        for row in range(2):
            for block in range(4):
                if int(inputs.block_doc[row, block]) < 0:
                    continue
                want = _replay(model, inputs, row, block)
                torch.testing.assert_close(out.logits[row, block], want, atol=1e-4, rtol=1e-4)


def test_ttt_mask_equals_brute_force():
    spec = _spec()
    inputs = _inputs(spec)
    mask = ttt_attention_mask(inputs)
    r, nb, k = inputs.block_ids.shape
    tc = inputs.ctx_doc.shape[1]
    assert mask.shape == (r, nb, k, tc + k)
    for row in range(r):
        for n in range(nb):
            doc, a = int(inputs.block_doc[row, n]), int(inputs.block_anchor[row, n])
            for s in range(k):
                for key in range(tc + k):
                    if key < tc:  # step-0 keys strictly before the root p = a-1
                        want = (
                            doc >= 0
                            and int(inputs.ctx_doc[row, key]) == doc
                            and int(inputs.ctx_positions[row, key]) < a - 1
                        )
                    else:  # own chain: step 0 (the root, position p) .. step s
                        want = key - tc <= s
                    assert bool(mask[row, n, s, key]) == want, (row, n, s, key)


def test_ttt_loss_is_decayed_forward_kl():
    spec = _spec()
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 2, STEPS, spec.vocab_size, generator=g)
    target = torch.randn(1, 2, STEPS, spec.vocab_size, generator=g)
    valid = torch.ones(1, 2, STEPS, dtype=torch.bool)
    valid[0, 1, 2:] = False
    w = ttt_step_weights(num_steps=STEPS, decay=0.8)
    assert torch.allclose(w, torch.tensor([1.0, 0.8, 0.64, 0.512]))
    parts = draft_loss(
        logits=logits,
        target_logits=target,
        target_ids=torch.zeros(1, 2, STEPS, dtype=torch.long),
        valid=valid,
        weights=w,
        confidence_logit=None,
        ce_weight=0.0,
        tv_weight=0.0,
        bce_weight=0.0,
        kl_weight=1.0,
    )
    num = den = 0.0
    for n in range(2):
        for s in range(STEPS):
            if valid[0, n, s]:
                pt = torch.softmax(target[0, n, s], -1)
                kl = float((pt * (pt.log() - torch.log_softmax(logits[0, n, s], -1))).sum())
                num += 0.8**s * kl
                den += 0.8**s
    assert float(parts.total) == pytest.approx(num / den, rel=1e-5)


def test_eagle3_config_defaults_and_errors():
    from pipeline.config import ConfigError

    base = dict(target="toy:trained", data=dict(uri="x"), out_dir="o", num_steps=1)
    cfg = parse_train_config({**base, "global_batch_size": 1, "draft": {"kind": "eagle3"}})
    assert (cfg.draft.num_layers, cfg.draft.block_size, cfg.draft.anchor_predicts) == (1, 7, True)
    assert cfg.loss.weights("eagle3") == (0.0, 0.0, 0.0) and cfg.loss.kl("eagle3") == 1.0
    assert cfg.loss.kl("dspark") == 0.0
    with pytest.raises(ConfigError, match="num_layers: 1"):
        parse_train_config(
            {**base, "global_batch_size": 1, "draft": {"kind": "eagle3", "num_layers": 2}}
        )


@pytest.fixture(scope="module")
def eagle3_draft(toy_shards, tmp_path_factory):
    return train_small_draft(toy_shards, tmp_path_factory.mktemp("eagle3"), dict(kind="eagle3"))


def test_loss_falls_and_export_is_speculators_eagle3(eagle3_draft, toy_shards):
    from safetensors import safe_open
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    from pipeline.table.dataset import Dataset

    result = eagle3_draft
    losses = [m["loss"] for m in result.metrics]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(
        f"eagle3 toy: loss {first:.3f} -> {last:.3f}, tau_tv {result.metrics[0]['tau_tv']:.2f} -> "
        f"{result.metrics[-1]['tau_tv']:.2f}, held-out {result.heldout}"
    )
    assert last < 0.7 * first, (first, last)
    assert result.metrics[-1]["kl"] == pytest.approx(result.metrics[-1]["loss"])
    assert result.metrics[-1]["tau_tv"] > result.metrics[0]["tau_tv"]
    assert {f"acc_{k}" for k in range(1, 8)} <= set(result.metrics[-1])

    aux = list(Dataset.open(str(toy_shards)).manifest().provenance.aux_layer_ids)
    config = json.loads((result.export_dir / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 7
    converted = SpeculatorsConfig.extract_transformers_pre_trained_config(
        json.loads(json.dumps(config))
    )
    assert converted["architectures"] == ["Eagle3Qwen3ForCausalLM"]
    assert converted["eagle_aux_hidden_state_layer_ids"] == aux  # no shift for eagle3
    assert converted["norm_before_residual"] is False and converted["num_hidden_layers"] == 1
    assert SpeculatorsConfig.extract_vllm_speculative_config(config) == {
        "method": "eagle3",
        "num_speculative_tokens": 7,
    }
    with safe_open(str(result.export_dir / "model.safetensors"), framework="pt") as f:
        names = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
    h, hd = 128, 32
    assert names["fc.weight"] == (h, 3 * h)
    assert names["layers.0.self_attn.q_proj.weight"] == (4 * hd, 2 * h)
    assert names["layers.0.self_attn.k_proj.weight"] == (2 * hd, 2 * h)
    assert names["layers.0.self_attn.o_proj.weight"] == (h, 4 * hd)
    assert {
        "layers.0.input_layernorm.weight",
        "layers.0.hidden_norm.weight",
        "layers.0.post_attention_layernorm.weight",
        "layers.0.self_attn.q_norm.weight",
        "layers.0.self_attn.k_norm.weight",
        "norm.weight",
    } <= set(names)
    # The target's tables ride along (speculators' Eagle3 reads them from the checkpoint).
    assert names["embed_tokens.weight"] == names["lm_head.weight"] == (1600, h)
    assert not any(n in ("d2t", "t2d") for n in names)


@pytest.mark.slow
def test_vllm_serves_eagle3_losslessly(eagle3_draft, plain_toy_decode, trained_target_dir):
    from pipeline.drafts.vllm_check import decode

    prompts, plain = plain_toy_decode
    spec = decode(
        trained_target_dir,
        prompts,
        max_tokens=SERVE_MAX_TOKENS,
        draft_dir=eagle3_draft.export_dir,
        method="eagle3",
        num_speculative_tokens=7,
        single_stream=True,  # one request at a time: a round drafts for one request
        round_times=True,
    )
    print(
        f"eagle3: drafts={spec.num_drafts} draft_tokens={spec.num_draft_tokens} "
        f"accepted={spec.num_accepted_tokens} per_pos={spec.accepted_per_pos} tau={spec.tau:.3f} "
        f"(teacher-forced held-out tau_greedy {eagle3_draft.heldout.get('tau_greedy', float('nan')):.3f})"
    )
    assert spec.outputs == plain.outputs, "eagle3: speculative output differs from plain"
    assert spec.num_drafts > 0 and spec.num_draft_tokens == 7 * spec.num_drafts
    assert spec.num_accepted_tokens == sum(spec.accepted_per_pos)
    per_pos = spec.accepted_per_pos
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
    assert spec.tau > 1.5  # a trained draft is accepted (vs 1.0 for a broken layout)
    # Every drafting round timed (the plugin's round timer, any draft kind): one per
    # verified draft, plus at most one unverified last proposal per request.
    assert spec.num_drafts <= len(spec.round_ms) <= spec.num_drafts + len(prompts)
    assert all(ms > 0 for ms in spec.round_ms)


@pytest.mark.slow
def test_vllm_serves_a_reduced_vocabulary_eagle3_losslessly(
    eagle3_draft, plain_toy_decode, trained_target_dir, toy_shards, tmp_path
):
    """The trained draft exported with a reduced vocabulary (the answers' most frequent
    tokens, d2t/t2d and the head's rows): vLLM's eagle3 loader reads the maps, its
    output equals plain decoding, and drafts are still accepted."""
    import dataclasses

    from pipeline.drafts.checkpoint import load_checkpoint
    from pipeline.drafts.export import TARGET_TENSORS, export_draft
    from pipeline.drafts.target_head import load_target_head
    from pipeline.drafts.vllm_check import decode
    from pipeline.drafts.vocab import select_draft_vocab
    from pipeline.train.config import TrainDataConfig
    from pipeline.train.data import TrainingData
    from pipeline.train.vocab import answer_token_counts, eos_token_ids

    ckpt = load_checkpoint(eagle3_draft.checkpoint)
    embed, head = load_target_head(trained_target_dir, dtype=None)
    counts = answer_token_counts(TrainingData(TrainDataConfig(uri=str(toy_shards))), len(embed))
    size = min(int((counts > 0).sum()) + 8, len(embed) // 2)  # a real cut of the 1600
    vocab = select_draft_vocab(counts, size, always=eos_token_ids(trained_target_dir))
    spec = dataclasses.replace(ckpt.spec, draft_vocab=vocab)
    out = export_draft(
        state=ckpt.model_state(),
        spec=spec,
        out=tmp_path / "reduced",
        model_type="eagle3",
        verifier=str(trained_target_dir),
        target_config=json.loads((trained_target_dir / "config.json").read_text()),
        target_tensors=dict(zip(TARGET_TENSORS, (embed, head), strict=True)),
    )
    prompts, plain = plain_toy_decode
    spec_run = decode(
        trained_target_dir,
        prompts,
        max_tokens=SERVE_MAX_TOKENS,
        draft_dir=out,
        method="eagle3",
        num_speculative_tokens=7,
    )
    print(f"eagle3, draft vocabulary {size} of {len(embed)}: tau={spec_run.tau:.3f}")
    assert spec_run.outputs == plain.outputs, "reduced eagle3: output differs from plain"
    assert spec_run.num_drafts > 0
    assert spec_run.tau > 1.5  # drafted ids reach the target as target ids (d2t applied)
