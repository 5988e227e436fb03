"""How sure a tau is: per-sample sums and a stratified bootstrap over samples.

Rounds within one sample are not independent (one hard answer makes many
short rounds), so resampling is by sample: within each domain, draw that
domain's samples with replacement, pool each domain's rounds, take the
macro average. A ratio of two drafts evaluated on the same samples (or the
same live prompts) is bootstrapped *paired*: one draw of sample ids serves
both, which cancels the variation both share (hard samples are hard for
every draft). Seeded: the same inputs give the same interval. A domain with
a single sample says nothing about its own spread: the interval is then
nan ("n/a" in reports) rather than a falsely tight one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 2000


@dataclass
class PerSample:
    """Accepted drafted tokens and verification rounds of each sample (columnar)."""

    ids: list[str]
    domain: list[str]
    accepted: list[int]  # sum over the sample's rounds
    rounds: list[int]

    def to_dict(self) -> dict:
        return {
            "ids": self.ids,
            "domain": self.domain,
            "accepted": self.accepted,
            "rounds": self.rounds,
        }

    @classmethod
    def from_dict(cls, data: dict) -> PerSample:
        return cls(
            list(data["ids"]), list(data["domain"]), list(data["accepted"]), list(data["rounds"])
        )

    def aligned(self, ids: Sequence[str]) -> PerSample:
        """The rows of `ids`, in that order (KeyError names a missing id)."""
        row = {s: i for i, s in enumerate(self.ids)}
        idx = [row[s] for s in ids]
        return PerSample(
            list(ids),
            [self.domain[i] for i in idx],
            [self.accepted[i] for i in idx],
            [self.rounds[i] for i in idx],
        )


def _strata(domain: Sequence[str]) -> list[np.ndarray] | None:
    """Row indices per domain; None when a domain has fewer than 2 samples."""
    by: dict[str, list[int]] = {}
    for i, d in enumerate(domain):
        by.setdefault(d, []).append(i)
    if not by or min(len(v) for v in by.values()) < 2:
        return None
    return [np.asarray(v) for _, v in sorted(by.items())]


def _macro(acc: np.ndarray, rounds: np.ndarray, draws: list[np.ndarray]) -> np.ndarray:
    """(R,) macro tau of R resamples; draws[k] (R, n_k) row indices of domain k."""
    taus = [1.0 + acc[d].sum(-1) / np.maximum(rounds[d].sum(-1), 1) for d in draws]
    return np.mean(taus, axis=0)


def _observed(domain: Sequence[str]) -> list[np.ndarray]:
    """Every sample once, per domain: `_macro` over these is the observed macro tau."""
    by: dict[str, list[int]] = {}
    for i, d in enumerate(domain):
        by.setdefault(d, []).append(i)
    return [np.asarray(v)[None] for _, v in sorted(by.items())]


def _draws(strata: list[np.ndarray], resamples: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [s[rng.integers(0, len(s), size=(resamples, len(s)))] for s in strata]


def macro_tau_interval(
    per_sample: PerSample, *, level: float = 0.95, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of the macro tau (stratified bootstrap over samples)."""
    acc, rounds = np.asarray(per_sample.accepted), np.asarray(per_sample.rounds)
    strata = _strata(per_sample.domain)
    if strata is None:
        return (float("nan"), float("nan"))
    macro = _macro(acc, rounds, _draws(strata, resamples, seed))
    lo, hi = np.quantile(macro, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def ratio_interval(
    num: PerSample,
    den: PerSample,
    *,
    level: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(ratio, lo, hi) of macro tau num / den over the samples both have, paired."""
    common = sorted(set(num.ids) & set(den.ids))
    if not common:
        raise ValueError("the two drafts share no evaluated sample: nothing to pair")
    a, b = num.aligned(common), den.aligned(common)
    if a.domain != b.domain:
        raise ValueError("the same sample ids carry different domains: not the same samples")
    acc_a, rnd_a = np.asarray(a.accepted), np.asarray(a.rounds)
    acc_b, rnd_b = np.asarray(b.accepted), np.asarray(b.rounds)
    full = _observed(a.domain)
    point = float(_macro(acc_a, rnd_a, full)[0] / _macro(acc_b, rnd_b, full)[0])
    strata = _strata(a.domain)
    if strata is None:
        return point, float("nan"), float("nan")
    draws = _draws(strata, resamples, seed)
    ratios = _macro(acc_a, rnd_a, draws) / _macro(acc_b, rnd_b, draws)
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return point, float(lo), float(hi)


def unpaired_ratio_interval(
    num: PerSample,
    den: PerSample,
    *,
    level: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(ratio, lo, hi) of macro tau num / den over two different sample sets (e.g. a
    source left out of training over the held-out split): each resampled on its own,
    stratified by domain."""
    sides = []
    for k, side in enumerate((num, den)):
        acc, rounds = np.asarray(side.accepted), np.asarray(side.rounds)
        if not side.domain:
            raise ValueError("a side of the ratio has no evaluated sample")
        full = _observed(side.domain)
        strata = _strata(side.domain)
        draws = None if strata is None else _draws(strata, resamples, seed + k)
        sides.append((acc, rounds, full, draws))
    point = float(_macro(*sides[0][:2], sides[0][2])[0] / _macro(*sides[1][:2], sides[1][2])[0])
    if sides[0][3] is None or sides[1][3] is None:
        return point, float("nan"), float("nan")
    ratios = _macro(*sides[0][:2], sides[0][3]) / _macro(*sides[1][:2], sides[1][3])
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return point, float(lo), float(hi)


def paired_rate_ratio(
    num: tuple[Sequence[float], Sequence[float]],
    den: tuple[Sequence[float], Sequence[float]],
    *,
    level: float = 0.95,
    resamples: int = RESAMPLES,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(ratio, lo, hi) of sum(tokens)/sum(seconds) of `num` over `den`, where both are
    (tokens, seconds) per prompt of the same prompts in the same order: the prompts
    are resampled together (a paired bootstrap)."""
    tn, sn = np.asarray(num[0], float), np.asarray(num[1], float)
    td, sd = np.asarray(den[0], float), np.asarray(den[1], float)
    if not (len(tn) == len(sn) == len(td) == len(sd)) or not len(tn):
        raise ValueError("a paired rate ratio needs the same prompts on both sides")
    point = float((tn.sum() / sn.sum()) / (td.sum() / sd.sum()))
    idx = np.random.default_rng(seed).integers(0, len(tn), size=(resamples, len(tn)))
    ratios = (tn[idx].sum(-1) / sn[idx].sum(-1)) / (td[idx].sum(-1) / sd[idx].sum(-1))
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return point, float(lo), float(hi)
