"""Offline T=0 acceptance on constructed drafts: an oracle, an always-wrong draft, a
draft right for exactly j tokens, and the walk's bookkeeping against hand counts."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.drafts.drafter import DraftBlocks
from pipeline.evaluate.offline import (
    accepted_lengths,
    evaluate_offline,
    inexact_reasons,
    position_acceptance,
    walk,
)
from pipeline.shards.reader import TrainingSample

VOCAB = 50


def make_sample(sample_id: str, domain: str, prompt_len: int, answer_len: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    t = prompt_len + answer_len
    return TrainingSample(
        sample_id=sample_id,
        source="constructed",
        domain=domain,
        input_ids=torch.randint(4, VOCAB, (t,), generator=g),
        loss_mask=torch.tensor([0] * prompt_len + [1] * answer_len, dtype=torch.bool),
        hidden_states=torch.randn(t, 8, generator=g).bfloat16(),
        last_hidden_state=torch.randn(t, 4, generator=g).bfloat16(),
        finish_reason="stop",
        num_prompt_tokens=prompt_len,
        num_generated_tokens=answer_len,
    )


class ConstructedDrafter:
    """Drafts the trajectory's own next tokens for the first `right` slots, then wrong ones."""

    def __init__(self, n: int, right: int) -> None:
        self.name, self.num_draft_tokens, self.right = f"right-{right}", n, right

    def draft(self, sample, anchors):
        t = sample.input_ids.shape[0]
        pos = (anchors[:, None] + 1 + torch.arange(self.num_draft_tokens)).clamp(max=t - 1)
        truth = sample.input_ids[pos]
        wrong = (truth + 1) % VOCAB  # never the trajectory's token
        slots = torch.arange(self.num_draft_tokens)[None, :] < self.right
        return DraftBlocks(anchors, torch.where(slots, truth, wrong), None)


SAMPLES = [
    make_sample("a", "math", 7, 41, 0),
    make_sample("b", "code", 5, 30, 1),
    make_sample("c", "math", 9, 17, 2),
]


@pytest.mark.parametrize("n", [4, 7])
def test_oracle_draft_accepts_every_token_of_every_full_round(n):
    report, _ = evaluate_offline(SAMPLES, ConstructedDrafter(n, right=n))
    assert report.tau_full_rounds == n + 1  # block size + 1 (anchor layout: n = block size)
    assert report.position_acceptance == [1.0] * n
    # Each trajectory of m answer tokens needs ceil((m - 1) / (n + 1)) rounds.
    expected = sum(math.ceil((s.num_generated_tokens - 1) / (n + 1)) for s in SAMPLES)
    assert report.num_rounds == expected
    assert report.tau > 1 + 0.6 * n  # the short last rounds pull the pooled tau down a bit


def test_always_wrong_draft_has_tau_one_and_one_round_per_token():
    report, _ = evaluate_offline(SAMPLES, ConstructedDrafter(5, right=0))
    assert report.tau == 1.0 and report.tau_macro == 1.0
    assert report.tau_by_domain == {"code": 1.0, "math": 1.0}
    assert report.num_rounds == sum(s.num_generated_tokens - 1 for s in SAMPLES)
    assert report.position_acceptance[0] == 0.0
    assert all(math.isnan(r) for r in report.position_acceptance[1:])  # never reached


def test_partially_right_draft_and_macro_average():
    n, j = 6, 2
    report, _ = evaluate_offline(SAMPLES, ConstructedDrafter(n, right=j))
    assert report.tau_full_rounds == j + 1
    assert report.position_acceptance[:j] == [1.0] * j
    assert report.position_acceptance[j] == 0.0
    taus = report.tau_by_domain
    assert report.tau_macro == pytest.approx((taus["math"] + taus["code"]) / 2)
    assert report.rounds_by_domain["code"] == math.ceil((30 - 1) / (j + 1))


def test_walk_and_acceptance_bookkeeping_by_hand():
    # Trajectory of length 10, answer starts at 3: anchors 3 (acc 2) -> 6 (acc 0) -> 7 (acc 3) -> end.
    accepted = torch.tensor([0, 0, 0, 2, 0, 0, 0, 3, 0, 0])
    assert walk(accepted=accepted, start=3, end=10) == [3, 6, 7]
    # Truncation to at most 1 drafted token per round changes the path.
    one = torch.ones(10, dtype=torch.long)
    assert walk(accepted=accepted, start=3, end=10, draft_len=one) == [3, 5, 6, 7]
    drafted = torch.tensor([[1, 2, 3], [1, 9, 3], [7, 2, 3]])
    truth = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    valid = torch.tensor([[True, True, False], [True, True, True], [True, True, True]])
    assert accepted_lengths(drafted=drafted, truth=truth, valid=valid).tolist() == [2, 1, 0]
    rates, counts = position_acceptance(accepted=torch.tensor([2, 1, 0]), valid=valid)
    assert counts == [3, 2, 0] and rates[:2] == [2 / 3, 1 / 2]


def test_the_walk_is_exact_only_on_greedy_lossless_data():
    assert inexact_reasons(generation={"temperature": 0.0, "top_p": 1.0}, codec="bf16") == []
    sampled = inexact_reasons(generation={"temperature": 0.7}, codec="bf16")
    assert len(sampled) == 1 and "generation.temperature is 0.7" in sampled[0]
    (corpus,) = inexact_reasons(generation={"backend": "corpus answers"}, codec="bf16")
    assert "generation.temperature is unset" in corpus
    (lossy,) = inexact_reasons(generation={"temperature": 0}, codec="fp8")
    assert "codec is 'fp8', which is lossy" in lossy
