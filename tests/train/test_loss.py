"""Losses and metrics against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from pipeline.drafts.dspark.model import slot_weights
from pipeline.train.loss import (
    block_stats,
    chunked_draft_loss,
    draft_loss,
    summarize,
)


def test_loss_parts_match_hand_computation():
    draft = torch.tensor([[[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]])  # (1, 1, 2, 3)
    target = torch.tensor([[[[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]])
    ids = torch.tensor([[[0, 1]]])
    valid = torch.tensor([[[True, False]]])
    conf = torch.tensor([[[0.3, 9.0]]])
    w = torch.tensor([1.0, 0.5])
    parts = draft_loss(
        logits=draft,
        target_logits=target,
        target_ids=ids,
        valid=valid,
        weights=w,
        confidence_logit=conf,
        ce_weight=0.1,
        tv_weight=0.9,
        bce_weight=1.0,
    )
    p = torch.softmax(draft[0, 0, 0], -1)
    ce = -torch.log(p[0])
    tv = 0.5 * (p - torch.full((3,), 1 / 3)).abs().sum()
    y = 1 - tv
    s = torch.sigmoid(torch.tensor(0.3))
    bce = -(y * torch.log(s) + (1 - y) * torch.log(1 - s))
    assert torch.allclose(parts.ce_sum, ce) and torch.allclose(parts.tv_sum, tv)
    assert torch.allclose(parts.bce_sum, bce, atol=1e-6)
    assert torch.allclose(parts.total, 0.1 * ce + 0.9 * tv + bce, atol=1e-6)
    assert parts.weight_sum == 1.0 and parts.tv[0, 0, 1] == 0  # invalid slot ignored


def test_global_normalizer_makes_split_batches_add_up():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3, 4, 11, generator=g)
    target = torch.randn(4, 3, 4, 11, generator=g)
    ids = torch.randint(0, 11, (4, 3, 4), generator=g)
    valid = torch.rand(4, 3, 4, generator=g) > 0.3
    w = slot_weights(block_size=4, first_offset=1, gamma=4.0)
    kw = dict(weights=w, confidence_logit=None, ce_weight=0.1, tv_weight=0.9, bce_weight=0.0)
    whole = draft_loss(logits=logits, target_logits=target, target_ids=ids, valid=valid, **kw)
    halves = [
        draft_loss(
            logits=logits[s],
            target_logits=target[s],
            target_ids=ids[s],
            valid=valid[s],
            normalizer=whole.weight_sum,
            **kw,
        )
        for s in (slice(0, 2), slice(2, 4))
    ]
    torch.testing.assert_close(halves[0].total + halves[1].total, whole.total)
    # Without the shared normaliser the mean of means differs (so the test can fail).
    local = [
        draft_loss(
            logits=logits[s], target_logits=target[s], target_ids=ids[s], valid=valid[s], **kw
        )
        for s in (slice(0, 2), slice(2, 4))
    ]
    assert not torch.allclose((local[0].total + local[1].total) / 2, whole.total)


def test_block_stats_acceptance_length():
    # One block of 3 drafting slots: slots 0 and 1 right, slot 2 wrong; TVs 0, 0.5, 1.
    v = 5
    ids = torch.tensor([[[1, 2, 3]]])
    logits = torch.zeros(1, 1, 3, v)
    logits[0, 0, 0, 1] = logits[0, 0, 1, 2] = logits[0, 0, 2, 4] = 5.0
    valid = torch.ones(1, 1, 3, dtype=torch.bool)
    tv = torch.tensor([[[0.0, 0.5, 1.0]]])
    match = logits.argmax(-1) == ids
    stats = block_stats(match=match, valid=valid, tv=tv, first_offset=1)
    out = summarize(stats=stats, first_offset=1)
    assert out["tau_greedy"] == 1 + 1 + 1 + 0
    assert out["tau_tv"] == 1 + 1 + 0.5 + 0
    assert (out["acc_1"], out["acc_2"], out["acc_3"]) == (1.0, 1.0, 0.0)
    # A block cut by the end of the answer does not count for tau.
    valid[0, 0, 2] = False
    stats = block_stats(match=match, valid=valid, tv=tv, first_offset=1)
    assert stats.num_blocks == 0


@pytest.mark.parametrize("chunk_size", [1, 7, 1000])
@pytest.mark.parametrize("kind", ["dspark", "eagle3"])
def test_chunked_loss_equals_the_dense_loss(chunk_size, kind):
    """Same value, parts, per-slot TV and argmax matches, and the same gradients (draft
    hidden states, Markov input and W2), whatever the chunk size."""
    g = torch.Generator().manual_seed(0)
    r, nb, b, d, h, v, rank = 2, 3, 4, 8, 8, 37, 3
    lm_head = torch.randn(v, d, generator=g)
    w2 = torch.randn(v, rank, generator=g, requires_grad=True)
    hidden = torch.randn(r, nb, b, d, generator=g, requires_grad=True)
    markov = torch.randn(r, nb, b, rank, generator=g, requires_grad=True)
    teacher_hidden = torch.randn(r, nb, b, h, generator=g)
    ids = torch.randint(0, v, (r, nb, b), generator=g)
    valid = torch.rand(r, nb, b, generator=g) > 0.3
    conf = torch.randn(r, nb, b, generator=g, requires_grad=True)
    w = slot_weights(block_size=b, first_offset=1, gamma=4.0)
    heads = kind == "dspark"
    weights = dict(ce_weight=0.1, tv_weight=1.8, bce_weight=1.0, kl_weight=0.0)
    if not heads:
        weights = dict(ce_weight=0.0, tv_weight=0.0, bce_weight=0.0, kl_weight=1.0)

    def logits_fn(x, m):
        out = x @ lm_head.T
        return out + m @ w2.T if heads else out

    def run(chunked: bool):
        for t in (hidden, markov, w2, conf):
            t.grad = None
        common = dict(
            target_ids=ids,
            valid=valid,
            weights=w,
            confidence_logit=conf if heads else None,
            normalizer=torch.tensor(5.0),
            **weights,
        )
        if chunked:
            parts = chunked_draft_loss(
                hidden=hidden,
                markov=markov if heads else None,
                teacher_hidden=teacher_hidden,
                logits_fn=logits_fn,
                teacher_fn=lambda x: x @ lm_head.T,
                chunk_size=chunk_size,
                **common,
            )
        else:
            parts = draft_loss(
                logits=logits_fn(hidden, markov),
                target_logits=teacher_hidden @ lm_head.T,
                **common,
            )
        parts.total.backward()
        grads = [t.grad.clone() for t in ((hidden, markov, w2, conf) if heads else (hidden,))]
        return parts, grads

    dense, dense_grads = run(False)
    chunked, chunked_grads = run(True)
    for name in ("total", "ce_sum", "tv_sum", "bce_sum", "kl_sum", "weight_sum", "tv"):
        torch.testing.assert_close(
            getattr(chunked, name), getattr(dense, name), rtol=1e-5, atol=1e-6
        )
    assert torch.equal(chunked.match, dense.match)
    for got, want in zip(chunked_grads, dense_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
