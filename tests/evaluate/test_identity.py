"""The T=0 identity check: identical outputs pass, a flip on a near-tie of the target's fp32
logits passes as such, and a draft that changes the output (here: outputs of another
target fed in as the drafted ones) fails loudly, naming where."""

from __future__ import annotations

import pytest

from pipeline.evaluate.identity import (
    IdentityMismatch,
    TargetLogits,
    check_identity,
    first_divergence,
    require_identity,
)

PROMPTS = [[5, 17, 40, 9, 33], [8, 21, 3, 77, 12, 6]]


def greedy(logits: TargetLogits, prompt: list[int], n: int) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        out.append(int(logits(prompt + out).argmax()))
    return out


@pytest.fixture(scope="module")
def trained(trained_target_dir):
    return TargetLogits(trained_target_dir)


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) is None  # a prefix: the caller decides


def test_identical_outputs_pass(trained):
    plain = [greedy(trained, p, 12) for p in PROMPTS]
    report = check_identity(
        prompts=PROMPTS, plain=plain, drafted=[list(o) for o in plain], logits=trained,
        tolerance=0.5,
    )  # fmt: skip
    assert report.ok and report.num_identical == 2 and not report.divergences
    require_identity(report, "same")  # does not raise


def test_a_flip_on_a_near_tie_passes_and_a_wider_gap_fails(trained):
    prompt = PROMPTS[0]
    plain = greedy(trained, prompt, 16)
    # The generated position whose top two logits are closest: flip it to the runner-up.
    margins = []
    for i in range(len(plain)):
        top2 = trained(prompt + plain[:i]).topk(2)
        margins.append((float(top2.values[0] - top2.values[1]), i, int(top2.indices[1])))
    margin, pos, runner_up = min(margins)
    drafted = plain[:pos] + [runner_up] + plain[pos + 1 :]
    loose = check_identity(
        prompts=[prompt], plain=[plain], drafted=[drafted], logits=trained,
        tolerance=margin + 1e-3,
    )  # fmt: skip
    (d,) = loose.divergences
    assert loose.ok and d.near_tie and d.position == pos and d.draft_token == runner_up
    assert d.gap == pytest.approx(margin, abs=1e-4)
    strict = check_identity(
        prompts=[prompt], plain=[plain], drafted=[drafted], logits=trained,
        tolerance=margin / 2,
    )  # fmt: skip
    assert not strict.ok and strict.to_dict()["num_real_divergences"] == 1


def test_a_draft_that_changes_the_output_fails_loudly(trained, random_target_dir):
    """A mismatched verifier: the 'drafted' outputs come from another toy target."""
    other = TargetLogits(random_target_dir)
    plain = [greedy(trained, p, 12) for p in PROMPTS]
    drafted = [greedy(other, p, 12) for p in PROMPTS]
    assert plain != drafted
    report = check_identity(
        prompts=PROMPTS, plain=plain, drafted=drafted, logits=trained, tolerance=0.5
    )
    assert not report.ok and report.to_dict()["num_real_divergences"] >= 1
    with pytest.raises(
        IdentityMismatch, match=r"(?s)changed the target's greedy output.*prompt \d"
    ):
        require_identity(report, "mismatched")


def test_an_early_stop_counts_only_on_eos(trained):
    plain = greedy(trained, PROMPTS[0], 10)
    cut = plain[:6]
    report = check_identity(
        prompts=[PROMPTS[0]], plain=[plain], drafted=[cut], logits=trained, tolerance=0.5
    )
    assert not report.ok and report.divergences[0].position == 6  # stopped for no reason
    ended = check_identity(
        prompts=[PROMPTS[0]], plain=[plain], drafted=[cut], logits=trained, tolerance=0.5,
        eos_token_ids=(cut[-1],),
    )  # fmt: skip
    assert ended.ok and ended.num_identical == 1
