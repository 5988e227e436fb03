"""The CE-first schedule against a hand computation, and in a training run's rows."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.drafts.dspark.model import slot_weights
from pipeline.train.loss import draft_loss
from pipeline.train.schedule import step_loss_weights

MIX = (0.1, 1.8, 1.0, 0.0)  # dspark: 0.1 CE + 0.9 L1 (a TV weight of 1.8) + BCE


def test_ce_first_ramps_linearly_from_ce_alone_to_the_mix():
    # f = 0.25 of 100 steps: a ramp over steps 0..24.
    at = lambda s: step_loss_weights(MIX, step=s, num_steps=100, ce_first_fraction=0.25)  # noqa: E731
    assert at(0) == (1.0, 0.0, 1.0, 0.0)
    ce, tv, bce, kl = at(10)  # r = 10 / 25 = 0.4: ce 1 - 0.4 x 0.9, tv 0.4 x 1.8
    assert ce == pytest.approx(0.64) and tv == pytest.approx(0.72) and (bce, kl) == (1.0, 0.0)
    assert at(25) == MIX and at(99) == MIX
    assert step_loss_weights(MIX, step=0, num_steps=100, ce_first_fraction=0.0) == MIX


def test_paper_position_weights_give_the_same_loss_as_slot_weights():
    """The DSpark paper weights the slot drafting token k by exp(-k/4); slot_weights uses
    exp(-(k-1)/4). The loss divides by the summed weight, so the two are one loss."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 2, 4, 7, generator=g)
    target = torch.randn(1, 2, 4, 7, generator=g)
    ids = torch.randint(0, 7, (1, 2, 4), generator=g)
    valid = torch.tensor([[[False, True, True, True], [False, True, True, False]]])
    ours = slot_weights(block_size=4, first_offset=0, gamma=4.0)
    paper = torch.tensor([0.0] + [math.exp(-k / 4) for k in (1, 2, 3)])
    assert torch.allclose(ours, paper * math.exp(0.25))

    def total(w):
        return draft_loss(
            logits=logits,
            target_logits=target,
            target_ids=ids,
            valid=valid,
            weights=w,
            confidence_logit=None,
            ce_weight=0.1,
            tv_weight=0.9,
            bce_weight=0.0,
        ).total

    # By hand: sum over valid slots of w_k (0.1 CE + 0.9 TV) / sum of w_k.
    p, q = torch.softmax(logits, -1), torch.softmax(target, -1)
    ce = -torch.log(p.gather(-1, ids[..., None]).squeeze(-1))
    tv = 0.5 * (p - q).abs().sum(-1)
    w = paper.expand(1, 2, 4) * valid
    by_hand = (w * (0.1 * ce + 0.9 * tv)).sum() / w.sum()
    assert torch.allclose(total(paper), by_hand, atol=1e-6)
    assert torch.allclose(total(ours), by_hand, atol=1e-6)


def test_a_ce_first_run_records_each_steps_weights(toy_shards, tmp_path):
    """metrics.jsonl's loss is the step's weighted sum: CE (+ BCE) alone at step 0, the
    configured mix once the ramp is over."""
    from train_configs import toy_train_config as _config

    from pipeline.train.trainer import train

    cfg = _config(toy_shards, tmp_path, num_steps=8, loss=dict(ce_first_fraction=0.5))
    rows = train(cfg, export=False).metrics
    first, last = rows[0], rows[-1]
    assert first["loss"] == pytest.approx(first["ce"] + first["bce"], rel=1e-5)
    assert last["loss"] == pytest.approx(
        0.1 * last["ce"] + 1.8 * last["tv"] + last["bce"], rel=1e-5
    )
    assert first["tv"] > 0  # TV is measured even while it carries no weight
