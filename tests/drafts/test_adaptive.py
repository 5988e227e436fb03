"""Adaptive drafting's rule (pipeline/drafts/adaptive.py); the plugin applying it in
vLLM is tested in tests/drafts/test_export.py."""

import pytest


def test_the_prefix_sent_is_the_longest_likely_enough_one():
    from pipeline.drafts.adaptive import prefix_lengths

    chance = [[0.9, 0.8, 0.5, 0.9], [0.4, 0.9, 0.9, 0.9], [1.0, 1.0, 1.0, 1.0]]
    # one request in flight of 10: threshold 0.1 -> 0.9, 0.72, 0.36, 0.324 all pass
    assert prefix_lengths(chance[:1], 1, 10) == [4]
    # three of 10: threshold 0.3 -> the second row's 0.4, 0.36, 0.324 pass, 0.2916 does not
    assert prefix_lengths(chance, 3, 10) == [4, 3, 4]
    # five of 10: 0.5 -> 0.9, 0.72 pass, 0.36 fails
    assert prefix_lengths(chance, 5, 10) == [2, 0, 4]
    # from the saturation on only a certain prefix is sent
    assert prefix_lengths(chance, 10, 10) == [0, 0, 4]
    assert prefix_lengths(chance[:2], 16, 10) == [0, 0]


def test_the_acceptance_rate_counts_only_the_positions_verified():
    from pipeline.drafts.adaptive import AcceptanceRate

    rate = AcceptanceRate(4, decay=1.0)
    assert rate.rates() == [0.5] * 4  # the prior
    rate.update(sent=4, accepted=1)  # position 1 accepted, 2 rejected, 3 and 4 never judged
    assert rate.rates() == [2 / 3, 1 / 3, 0.5, 0.5]
    rate.update(sent=2, accepted=2)  # both sent accepted; 3 and 4 were not sent
    assert rate.rates() == [3 / 4, 2 / 4, 0.5, 0.5]
    fading = AcceptanceRate(2, decay=0.5)
    fading.update(sent=2, accepted=0)  # position 1 rejected: 1 / 3
    for _ in range(20):  # rounds with nothing sent: back toward one in two
        fading.fade()
    assert abs(fading.rates()[0] - 0.5) < 1e-4


def test_adaptive_drafting_is_set_by_one_number(monkeypatch):
    from pipeline.drafts.adaptive import ADAPTIVE_ENV, adaptive_requests

    monkeypatch.delenv(ADAPTIVE_ENV, raising=False)
    assert adaptive_requests() is None
    monkeypatch.setenv(ADAPTIVE_ENV, "16")
    assert adaptive_requests() == 16.0
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv(ADAPTIVE_ENV, bad)
        with pytest.raises(ValueError, match=f"{ADAPTIVE_ENV}='{bad}': give the number"):
            adaptive_requests()


def test_adaptive_schedule_is_the_rule_in_vllms_batch_size_lookup():
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    from pipeline.drafts.adaptive import (
        DRAFTING_COST,
        PRIOR_CHANCE,
        adaptive_schedule,
        prefix_lengths,
        worth_drafting,
    )

    # vLLM's scheduler reads K from this lookup by requests in the step: what is worth
    # drafting and sending at the prior chance, a token costing its drafting as much as
    # its verification (2 x requests / 64), fewer as the load grows, none from where even
    # one token is not (the drafter then runs no draft pass).
    lookup = build_dynamic_sd_schedule_lookup(adaptive_schedule(64, 7), 64, 7)
    # 2/64 <= 0.5^5; 4/64 <= 0.5^4; 6-8/64 <= 0.5^3; 10-16/64: 0.5^2; 18-32/64: 0.5; none on.
    assert lookup[1:18] == [5, 4, 3, 3] + [2] * 4 + [1] * 8 + [0]
    assert lookup[18:] == [0] * 47
    assert build_dynamic_sd_schedule_lookup(adaptive_schedule(64, 2), 16, 2)[1:10] == [2] * 8 + [1]
    assert build_dynamic_sd_schedule_lookup(adaptive_schedule(1, 4), 8, 4)[1:] == [0] * 8
    # The schedule's K is the per-request rule's prefix at the prior chance, with the
    # drafting counted (the plugin's trimming weighs verification only).
    for requests in (1, 3, 9, 17):
        want = prefix_lengths([[PRIOR_CHANCE] * 7], requests * (1 + DRAFTING_COST), 64)[0]
        assert worth_drafting([PRIOR_CHANCE] * 7, requests, 64) == want


def test_the_tokens_worth_drafting_follow_the_acceptance_the_traffic_shows():
    """The plugin asks the drafter for `worth_drafting` at the live rates, in place of the
    schedule's prior: a draft the traffic accepts drafts more than the schedule at the
    same load, one it rejects drafts none where the schedule would still draft."""
    from pipeline.drafts.adaptive import AcceptanceRate, adaptive_schedule, worth_drafting

    def schedule_k(requests):
        return next(n for lo, hi, n in adaptive_schedule(64, 4) if lo <= requests <= hi)

    accepted, rejected = AcceptanceRate(4, decay=1.0), AcceptanceRate(4, decay=1.0)
    for _ in range(200):
        accepted.update(sent=4, accepted=4)
        rejected.update(sent=1, accepted=0)
    # 8 of 64 requests, a token counted twice: whole-prefix chance >= 0.25
    assert schedule_k(8) == 2
    assert worth_drafting(accepted.rates(), 8, 64) == 4  # ~0.99 a position
    assert worth_drafting(rejected.rates(), 8, 64) == 0  # ~0.01 at the first
    # by hand: 0.9 * 0.5 = 0.45 >= 6/64 * 2; 0.45 * 0.3 = 0.135 < 0.1875
    assert worth_drafting([0.9, 0.5, 0.3], 6, 64) == 2
