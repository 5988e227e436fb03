"""Drafting every anchor in one pass equals drafting round by round with only the past.

The offline walk drafts all anchors of a sample in one forward pass and runs
the Markov head left to right itself. A brute-force reference calls the
model once per anchor with the context cut at the anchor and the model's
own Markov path (prev_ids = the tokens drafted so far), one slot at a time.
Both layouts; random weights with a non-zero Markov W2 so the head matters.
"""

from __future__ import annotations

import pytest
import torch
from draft_specs import SMALL, random_sample, tiny_spec

from pipeline.drafts.dspark.drafter import DSparkDrafter, drafting_slots
from pipeline.drafts.dspark.model import DSparkDraft
from pipeline.drafts.inputs import DraftInputs
from pipeline.drafts.spec import DraftSpec
from pipeline.shards.reader import TrainingSample

V, H = SMALL["vocab_size"], SMALL["hidden_size"]


def _spec(sample_from_anchor: bool) -> DraftSpec:
    return tiny_spec(
        **SMALL, max_position_embeddings=256, sample_from_anchor=sample_from_anchor, markov_rank=6
    )


def _model(spec: DraftSpec) -> DSparkDraft:
    torch.manual_seed(0)
    model = DSparkDraft(spec, torch.randn(V, H), torch.randn(V, H) * 0.3)
    torch.nn.init.normal_(model.markov_head.markov_w1.weight, std=1.0)  # a strong Markov bias
    torch.nn.init.normal_(model.markov_head.markov_w2.weight, std=1.0)
    torch.nn.init.normal_(model.confidence_head.proj.weight, std=1.0)
    return model.eval()


def _sample(t: int = 20, prompt: int = 6) -> TrainingSample:
    return random_sample(vocab=V, hidden=H, t=t, prompt=prompt)


def _brute_force(model: DSparkDraft, sample: TrainingSample, a: int):
    spec = model.spec
    b = spec.block_size
    slots = list(range(b))[drafting_slots(spec)]
    block = torch.full((1, 1, b), spec.mask_token_id)
    block[0, 0, 0] = sample.input_ids[a]
    prev = torch.zeros(1, 1, b, dtype=torch.long)
    tokens, conf = [], []
    last = int(sample.input_ids[a])
    for s in slots:
        prev[0, 0, s] = last
        inputs = DraftInputs(
            ctx_features=sample.hidden_states[None, :a],  # only the past exists
            ctx_positions=torch.arange(a)[None],
            ctx_doc=torch.zeros(1, a, dtype=torch.long),
            block_ids=block,
            block_anchor=torch.tensor([[a]]),
            block_doc=torch.zeros(1, 1, dtype=torch.long),
            prev_ids=prev,
        )
        with torch.no_grad():
            out = model(inputs)
        last = int(out.logits[0, 0, s].argmax())
        tokens.append(last)
        conf.append(float(out.confidence_logit[0, 0, s]))
    return tokens, conf


@pytest.mark.parametrize("sample_from_anchor", [True, False])
def test_all_anchors_at_once_equal_round_by_round(sample_from_anchor):
    model = _model(_spec(sample_from_anchor))
    sample = _sample()
    anchors = torch.arange(6, 19)
    blocks = DSparkDrafter("x", model).draft(sample, anchors)
    seen: set[int] = set()
    assert blocks.tokens.shape == (len(anchors), model.spec.num_draft_tokens)
    for i, a in enumerate(anchors.tolist()):
        tokens, conf = _brute_force(model, sample, a)
        assert blocks.tokens[i].tolist() == tokens
        seen.update(tokens)
        assert blocks.confidence_logit[i].tolist() == pytest.approx(conf, abs=1e-4)
    assert len(seen) > 5  # not a degenerate draft that always says the same token


def test_backbone_only_ignores_the_heads():
    model = _model(_spec(False))
    sample = _sample()
    anchors = torch.arange(6, 19)
    with_heads = DSparkDrafter("x", model).draft(sample, anchors)
    backbone = DSparkDrafter("x", model, use_heads=False).draft(sample, anchors)
    assert backbone.confidence_logit is None
    assert not torch.equal(with_heads.tokens, backbone.tokens)  # the strong Markov bias matters
    torch.nn.init.zeros_(model.markov_head.markov_w2.weight)  # W2 = 0: DSpark == its backbone
    assert torch.equal(DSparkDrafter("x", model).draft(sample, anchors).tokens, backbone.tokens)
