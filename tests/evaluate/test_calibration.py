"""Calibration metrics and temperature scaling on constructed events; truncation sweep."""

from __future__ import annotations

import pytest
import torch

from pipeline.evaluate.calibration import (
    Calibration,
    conditional_events,
    expected_calibration_error,
    fit_temperature,
    roc_auc,
    round_events,
    truncated_lengths,
    truncation_sweep,
)
from pipeline.evaluate.offline import AnchorTable


def _events(num: int, scale: float, seed: int = 0):
    """Labels drawn from sigmoid(z); the head reports z * scale (over-confident if scale > 1)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(num, generator=g) * 2
    y = torch.rand(num, generator=g) < torch.sigmoid(z)
    return z * scale, y


def test_temperature_recovers_the_overconfidence_factor():
    logits, labels = _events(20_000, scale=3.0)
    assert fit_temperature(logits=logits, labels=labels) == pytest.approx(3.0, rel=0.1)
    before = expected_calibration_error(probs=torch.sigmoid(logits), labels=labels)
    after = expected_calibration_error(probs=torch.sigmoid(logits / 3.0), labels=labels)
    assert before > 0.08 and after < 0.02


def test_auc_bounds_and_ties():
    y = torch.tensor([0, 0, 1, 1], dtype=torch.bool)
    assert roc_auc(scores=torch.tensor([0.1, 0.2, 0.8, 0.9]), labels=y) == 1.0
    assert roc_auc(scores=torch.tensor([0.9, 0.8, 0.2, 0.1]), labels=y) == 0.0
    assert roc_auc(scores=torch.ones(4), labels=y) == 0.5  # all tied
    logits, labels = _events(5000, 1.0)
    assert 0.75 < roc_auc(scores=logits, labels=labels) < 0.95


def _table(accepted_per_anchor, conf_logits, n):
    """One constructed trajectory: prompt of 1 token, anchors 1..T-2."""
    t = len(accepted_per_anchor) + 2
    acc = torch.zeros(t, dtype=torch.long)
    acc[1 : t - 1] = torch.tensor(accepted_per_anchor)
    conf = torch.zeros(t, n)
    conf[1 : t - 1] = torch.tensor(conf_logits, dtype=torch.float32)
    pos = torch.arange(t)[:, None] + 1 + torch.arange(n)
    return AnchorTable("x", 1, t, acc, pos < t, conf)


def test_conditional_events_and_truncation_sweep():
    n = 3
    # Confident where the draft is right: anchor with acc 3 has high confidence everywhere.
    tab = _table(
        [3, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0, 0],
        [[4, 4, 4]]
        + [[-4, -4, -4]] * 3
        + [[4, 4, 4]]
        + [[-4, -4, -4]] * 3
        + [[4, -4, -4]]
        + [[-4, -4, -4]] * 3,
        n,
    )
    ev = conditional_events([tab], n)
    assert [int(y.numel()) for y in ev.labels] == [12, 3, 2]  # reached positions 1, 2, 3
    assert ev.labels[0].sum() == 3 and ev.labels[1].sum() == 2
    cal = Calibration((1.0, 1.0, 1.0), (12, 3, 2), 1)
    rows = truncation_sweep([tab], calibration=cal, thresholds=[0.5, 1.01], num_draft_tokens=n)
    none, half, all_cut = rows
    assert none["threshold"] == 0.0 and none["verify_rate"] == 1.0
    # Confidence is exactly right here, so truncating at 0.5 keeps tau and verifies less.
    assert half["tau"] == none["tau"] and half["verify_rate"] < 0.5
    assert half["accepted_per_verified_token"] == 1.0
    assert all_cut["tau"] == 1.0 and all_cut["verify_rate"] == 0.0
    lens = truncated_lengths(
        confidence=torch.tensor([[0.9, 0.2, 0.9], [0.1, 0.9, 0.9]]), threshold=0.5
    )
    assert lens.tolist() == [1, 0]


def test_round_events_are_conditional_on_the_accepted_prefix(tmp_path):
    """A round that accepted 1 of 3 drafted tokens gives events at positions 1 (accepted)
    and 2 (rejected), none at 3; a fully accepted round one at every position."""
    conf = torch.tensor([0.5, -0.5, 2.0])
    events = round_events([(conf, 1), (conf, 3)], num_draft_tokens=3)
    assert [z.tolist() for z in events.logits] == [[0.5, 0.5], [-0.5, -0.5], [2.0]]
    assert [y.tolist() for y in events.labels] == [[True, True], [False, True], [True]]
    cal = Calibration((1.0, 2.0, 1.0), (2, 2, 1), 2, sampling_temperature=0.7)
    cal.save(tmp_path)
    assert Calibration.load(tmp_path) == cal
    with pytest.raises(ValueError, match="refit with calibration.temperature: 0.0"):
        Calibration.load(tmp_path, temperature=0.0)
