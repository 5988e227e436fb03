"""Bootstrap intervals of tau: they cover the truth at about their level, shrink with
more samples, pair drafts on the same samples, and are reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.evaluate.uncertainty import PerSample, macro_tau_interval, ratio_interval

DOMAINS = ("code", "math", "chat")


def _draw(rng, n_per_domain: int, p_accept: dict[str, float], n: int = 5) -> PerSample:
    """Samples of 3-12 rounds; each round accepts a geometric prefix capped at n."""
    ids, dom, acc, rounds = [], [], [], []
    for d in DOMAINS:
        for i in range(n_per_domain):
            r = int(rng.integers(3, 13))
            a = np.minimum(rng.geometric(1 - p_accept[d], size=r) - 1, n)
            ids.append(f"{d}-{i}")
            dom.append(d)
            acc.append(int(a.sum()))
            rounds.append(r)
    return PerSample(ids, dom, acc, rounds)


def _true_macro(p_accept: dict[str, float], n: int = 5) -> float:
    taus = []
    for d in DOMAINS:
        p = p_accept[d]
        # E[min(G, n)] for G ~ geometric failures with success prob 1 - p
        taus.append(1 + sum(p**k for k in range(1, n + 1)))
    return float(np.mean(taus))


P = {"code": 0.8, "math": 0.6, "chat": 0.4}


def test_the_interval_covers_the_true_macro_tau_at_about_its_level():
    rng = np.random.default_rng(0)
    truth = _true_macro(P)
    trials = 200
    covered = sum(
        lo <= truth <= hi
        for lo, hi in (
            macro_tau_interval(_draw(rng, 30, P), resamples=500, seed=t) for t in range(trials)
        )
    )
    # 95% nominal; the bootstrap percentile interval runs a little narrow at n=30.
    assert 0.85 * trials <= covered <= trials


def test_more_samples_narrow_the_interval_and_seeds_reproduce_it():
    rng = np.random.default_rng(1)
    small, large = _draw(rng, 20, P), _draw(rng, 320, P)
    lo_s, hi_s = macro_tau_interval(small)
    lo_l, hi_l = macro_tau_interval(large)
    assert (hi_l - lo_l) < 0.4 * (hi_s - lo_s)  # 16x the samples: about 1/4 the width
    assert macro_tau_interval(small, seed=3) == macro_tau_interval(small, seed=3)


def test_ratio_is_paired_on_common_samples():
    rng = np.random.default_rng(2)
    den = _draw(rng, 40, P)
    same = ratio_interval(den, den)
    assert same == pytest.approx((1.0, 1.0, 1.0))
    # One more accepted token every round: a better draft on exactly the same samples.
    num = PerSample(
        den.ids,
        den.domain,
        [a + r for a, r in zip(den.accepted, den.rounds, strict=True)],
        den.rounds,
    )
    point, lo, hi = ratio_interval(num, den)
    macro = lambda s: np.mean(  # noqa: E731
        [
            1
            + sum(a for a, d in zip(s.accepted, s.domain, strict=True) if d == dom)
            / sum(r for r, d in zip(s.rounds, s.domain, strict=True) if d == dom)
            for dom in DOMAINS
        ]
    )
    assert point == pytest.approx(macro(num) / macro(den))
    assert 1.0 < lo <= point <= hi
    # Pairing cancels shared difficulty: the ratio is tighter than either tau alone.
    lo_n, hi_n = macro_tau_interval(num)
    assert (hi - lo) * macro(den) < (hi_n - lo_n)
    # Only common ids pair; a draft evaluated on other samples cannot be compared.
    shifted = PerSample([i + "x" for i in den.ids], den.domain, den.accepted, den.rounds)
    with pytest.raises(ValueError, match="share no evaluated sample"):
        ratio_interval(shifted, den)


def test_a_domain_with_one_sample_gives_no_interval():
    one = PerSample(["a", "b", "c"], ["code", "code", "math"], [3, 4, 5], [2, 2, 2])
    lo, hi = macro_tau_interval(one)
    assert np.isnan(lo) and np.isnan(hi)
    point, lo, hi = ratio_interval(one, one)
    assert point == 1.0 and np.isnan(lo) and np.isnan(hi)


def test_paired_rate_ratio_is_the_ratio_of_pooled_rates_with_an_interval():
    from pipeline.evaluate.uncertainty import paired_rate_ratio

    rng = np.random.default_rng(0)
    tokens = rng.integers(60, 128, 40).tolist()
    base_s = (np.asarray(tokens) / 40.0 * rng.uniform(0.9, 1.1, 40)).tolist()
    fast_s = [s / 2.0 for s in base_s]  # every prompt twice as fast
    point, lo, hi = paired_rate_ratio((tokens, fast_s), (tokens, base_s))
    assert point == pytest.approx(2.0) and lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    noisy = (np.asarray(fast_s) * rng.uniform(0.7, 1.3, 40)).tolist()
    point, lo, hi = paired_rate_ratio((tokens, noisy), (tokens, base_s))
    assert lo < point < hi and 1.5 < lo and hi < 2.7
    with pytest.raises(ValueError, match="same prompts"):
        paired_rate_ratio((tokens[:3], fast_s[:3]), (tokens, base_s))


def test_unpaired_ratio_resamples_two_sample_sets_on_their_own():
    from pipeline.evaluate.uncertainty import PerSample, unpaired_ratio_interval

    def side(prefix, domains, acc, n):
        return PerSample(
            [f"{prefix}{i}" for i in range(n)],
            [domains[i % len(domains)] for i in range(n)],
            [acc + (i % 3) for i in range(n)],
            [4] * n,
        )

    heldout = side("h", ["chat", "code"], 4, 60)  # tau about 2.0
    left_out = side("o", ["qa"], 2, 40)  # tau about 1.5
    point, lo, hi = unpaired_ratio_interval(left_out, heldout)
    assert point == pytest.approx((1 + 3 / 4) / (1 + 5 / 4), rel=0.02)
    assert lo < point < hi
    single = PerSample(["x"], ["qa"], [2], [4])
    assert np.isnan(unpaired_ratio_interval(single, heldout)[1])  # one sample: no interval
