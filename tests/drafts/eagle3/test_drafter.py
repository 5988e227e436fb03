"""EAGLE-3 drafting in the evaluator: every anchor at once equals vLLM's loop round by
round with only the past; the free-running chain and teacher forcing accept the same
prefix of a constructed trajectory; T > 0 returns the distributions it sampled from."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from draft_specs import SMALL, random_sample, tiny_spec

from pipeline.drafts.eagle3.drafter import Eagle3Drafter, eagle3_inputs
from pipeline.drafts.eagle3.model import Eagle3Draft
from pipeline.evaluate.offline import accepted_lengths, anchor_table
from pipeline.shards.reader import TrainingSample

V, H, K = SMALL["vocab_size"], SMALL["hidden_size"], 4


def _model() -> Eagle3Draft:
    spec = tiny_spec(kind="eagle3", **SMALL, block_size=K)
    torch.manual_seed(0)
    model = Eagle3Draft(spec, torch.randn(V, H), torch.randn(V, H))
    with torch.no_grad():  # weights large enough that the chain depends on its inputs
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.4)
    return model.eval()


def _sample(t: int = 24, prompt: int = 6) -> TrainingSample:
    return random_sample(vocab=V, hidden=H, t=t, prompt=prompt)


def _round_by_round(model: Eagle3Draft, sample: TrainingSample, a: int) -> list[int]:
    """vLLM's loop for anchor a with only the past: the context cut after the anchor
    (features up to the root p = a-1), one step at a time, each step fed the token
    the previous step chose (teacher-forced on the draft's own tokens)."""
    ids, feats = sample.input_ids[: a + 1], sample.hidden_states[: a + 1].clone()
    feats[a] = 1e3  # the anchor's own features do not exist yet: garbage must not matter
    chain = [int(ids[a])]
    for s in range(K):
        inputs = eagle3_inputs(ids, feats, torch.tensor([a]), K)
        inputs.prev_ids[0, 0, : s + 1] = torch.tensor(chain)
        with torch.no_grad():
            _, logits, _ = model.unroll(inputs)
        chain.append(int(logits[0, 0, s].argmax()))
    return chain[1:]


def test_every_anchor_at_once_equals_vllms_loop_round_by_round():
    model, sample = _model(), _sample()
    anchors = torch.arange(6, 23)
    blocks = Eagle3Drafter("e", model).draft(sample, anchors)
    assert blocks.tokens.shape == (len(anchors), K)
    seen: set[int] = set()
    for i, a in enumerate(anchors.tolist()):
        expected = _round_by_round(model, sample, a)
        assert blocks.tokens[i].tolist() == expected
        seen.update(expected)
    assert len(seen) > 5  # not a degenerate draft that always says the same token


@pytest.mark.parametrize("right", [0, 2, K])
def test_free_running_and_teacher_forcing_accept_the_same_prefix(right):
    """A trajectory that follows the draft's own chain for `right` tokens at one anchor:
    both ways accept exactly `right` there, and agree at every other anchor."""
    model, sample = _model(), _sample()
    drafter = Eagle3Drafter("e", model)
    a0 = 9
    chain = drafter.draft(sample, torch.tensor([a0])).tokens[0]
    ids = sample.input_ids.clone()
    ids[a0 + 1 : a0 + 1 + right] = chain[:right]
    if right < K:
        ids[a0 + 1 + right] = (chain[right] + 1) % V  # the trajectory leaves the chain here
    sample = dataclasses.replace(sample, input_ids=ids)
    anchors = torch.arange(6, 23)
    t = ids.shape[0]
    pos = anchors[:, None] + 1 + torch.arange(K)
    truth, valid = ids[pos.clamp(max=t - 1)], pos < t
    free = accepted_lengths(drafted=drafter.draft(sample, anchors).tokens, truth=truth, valid=valid)
    forced = drafter.draft(sample, anchors, teacher_forced=True).tokens
    assert torch.equal(free, accepted_lengths(drafted=forced, truth=truth, valid=valid))
    assert int(free[a0 - 6]) == right
    table = anchor_table(sample, drafter)  # the offline walk's table reads the same
    assert int(table.accepted[a0]) == right


def test_sampling_returns_the_distribution_each_token_came_from():
    model, sample = _model(), _sample()
    drafter = Eagle3Drafter("e", model)
    ids, feats = sample.input_ids[:15], sample.hidden_states[:15]
    g = torch.Generator().manual_seed(0)
    hot = drafter.propose(ids, feats, temperature=1.0, generator=g)
    assert hot.probs.shape == (1, K, V)
    assert torch.allclose(hot.probs.sum(-1), torch.ones(1, K))
    assert bool((hot.probs[0].gather(-1, hot.tokens[0, :, None]) > 0).all())
    # The chain conditions on its own samples: teacher-forcing those tokens gives the same q.
    inputs = eagle3_inputs(ids, feats, torch.tensor([14]), K)
    inputs.prev_ids[0, 0, 1:] = hot.tokens[0, :-1]
    with torch.no_grad():
        _, logits, _ = model.unroll(inputs)
    assert torch.allclose(torch.softmax(logits[0], -1), hot.probs, atol=1e-5)
    cold = drafter.propose(ids, feats, temperature=0.0, generator=None)
    assert cold.probs is None
    assert cold.tokens.tolist() == [_round_by_round(model, _sample(), 14)]


def test_an_anchor_without_a_root_is_refused():
    with pytest.raises(ValueError, match="anchor >= 1"):
        eagle3_inputs(torch.arange(5), torch.zeros(5, 2 * H), torch.tensor([0]), K)
