"""Exact acceptance length at temperature 0, without a live loop (docs/design.md#acceptance-length).

At T=0 the target's output is its greedy trajectory, which the held-out
shards already hold (the regenerated answer), together with the target's
features at every position. Speculative decoding then walks that trajectory:
the first answer token comes from prefill; each verification round drafts a
block from the token just committed (the anchor, position a) and the
features of positions < a, accepts the longest drafted prefix equal to the
trajectory, and commits one more token from the target (the bonus, or the
correction at the first mismatch). The next anchor is a + accepted + 1.

tau = 1 + accepted / rounds, pooled over rounds (vLLM's definition,
`1 + num_accepted_tokens / num_drafts`). Drafted tokens past the end of the
trajectory cannot be checked and count as rejected; a round is *full* when
all n drafted positions and the bonus lie inside the trajectory.

The walk is exact only when the shards hold the target's greedy output
(`generation.temperature` 0) and the features the target computed (a lossless
codec); `inexact_reasons` says why a dataset's provenance falls short. On such
data the same walk measures teacher-forced agreement, not acceptance.

Metrics here are pure keyword-only functions over tensors; `evaluate_offline`
is the loop over samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.evaluate.uncertainty import PerSample, macro_tau_interval

if TYPE_CHECKING:
    import torch

    from pipeline.drafts.drafter import DraftBlocks, Drafter
    from pipeline.shards.reader import TrainingSample


def inexact_reasons(*, generation: dict, codec: str) -> list[str]:
    """Why the T=0 walk over shards of this provenance is not exact acceptance ([]: it is)."""
    from pipeline.shards.codecs import get_codec

    reasons = []
    temperature = generation.get("temperature")
    if temperature is None:
        reasons.append(
            f"generation.temperature is unset (generation {generation}): the answers are "
            "not known to be the target's greedy output"
        )
    elif float(temperature) != 0.0:
        reasons.append(
            f"generation.temperature is {temperature}: the answers are samples, not the "
            "target's greedy trajectory"
        )
    if not get_codec(codec).lossless:
        reasons.append(
            f"codec is {codec!r}, which is lossy: the draft reads other features than the "
            "target computed"
        )
    return reasons


def accepted_lengths(
    *,
    drafted: torch.Tensor,  # (A, n) drafted tokens per anchor
    truth: torch.Tensor,  # (A, n) trajectory tokens at a+1..a+n
    valid: torch.Tensor,  # (A, n) bool: position a+1+j lies inside the trajectory
) -> torch.Tensor:
    """(A,) int64: the longest drafted prefix equal to the trajectory, per anchor."""
    import torch

    match = (drafted == truth) & valid
    return torch.cumprod(match.long(), dim=-1).sum(-1)


def walk(
    *,
    accepted: torch.Tensor,  # (T,) int64 accepted drafts if position a is the anchor
    start: int,  # first anchor: the first answer token (from prefill)
    end: int,  # trajectory length T; anchors run while a < T - 1
    draft_len: torch.Tensor | None = None,  # (T,) int64 tokens sent for verification
) -> list[int]:
    """Anchor positions of the verification rounds along one trajectory.

    With `draft_len` (confidence truncation) a round accepts at most that many.
    """
    anchors = []
    a = start
    while a < end - 1:
        anchors.append(a)
        acc = int(accepted[a])
        if draft_len is not None:
            acc = min(acc, int(draft_len[a]))
        a += acc + 1
    return anchors


@dataclass
class Rounds:
    """Every verification round of a walk, flattened over samples (N rounds, n slots)."""

    num_draft_tokens: int  # n
    domain: list[str]  # (N,) domain of each round's sample
    sample: torch.Tensor  # (N,) int64 sample index
    anchor: torch.Tensor  # (N,) int64 anchor position
    accepted: torch.Tensor  # (N,) int64 accepted drafted tokens
    valid: torch.Tensor  # (N, n) bool: drafted position inside the trajectory
    full: torch.Tensor  # (N,) bool: all n positions and the bonus inside the trajectory
    draft_len: torch.Tensor  # (N,) int64 tokens sent for verification (n unless truncated)
    confidence_logit: torch.Tensor | None = None  # (N, n) raw confidence-head logits

    @property
    def num_rounds(self) -> int:
        return int(self.accepted.numel())


def tau(*, accepted: torch.Tensor) -> float:
    """Pooled acceptance length: 1 + sum(accepted) / rounds (nan without rounds)."""
    return 1.0 + float(accepted.float().mean()) if accepted.numel() else math.nan


def position_acceptance(
    *, accepted: torch.Tensor, valid: torch.Tensor, draft_len: torch.Tensor | None = None
) -> tuple[list[float], list[int]]:
    """Conditional acceptance per drafted position k = 1..n and how many rounds reached k.

    P(position k accepted | positions 1..k-1 accepted), over rounds where
    position k lies inside the trajectory (and was sent for verification).
    """
    import torch

    n = valid.shape[1]
    k = torch.arange(1, n + 1)
    reached = (accepted[:, None] >= k - 1) & valid  # (N, n)
    if draft_len is not None:
        reached &= draft_len[:, None] >= k
    took = reached & (accepted[:, None] >= k)
    num = reached.sum(0)
    rates = [float(t) / float(r) if r else math.nan for t, r in zip(took.sum(0), num, strict=True)]
    return rates, [int(r) for r in num]


@dataclass
class AcceptanceReport:
    """tau per domain and pooled, conditional acceptance per position."""

    num_draft_tokens: int
    tau: float  # pooled over all rounds
    tau_macro: float  # mean of the per-domain taus
    tau_full_rounds: float  # pooled over full rounds only
    tau_by_domain: dict[str, float]
    rounds_by_domain: dict[str, int]
    position_acceptance: list[float]  # (n,) conditional acceptance at positions 1..n
    position_counts: list[int]  # (n,) rounds that reached each position
    num_rounds: int
    num_samples: int
    per_sample: PerSample | None = None  # accepted and rounds of each sample (bootstrap input)
    tau_macro_ci95: tuple[float, float] | None = None  # stratified bootstrap over samples
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        ci = self.tau_macro_ci95
        return {
            "num_draft_tokens": self.num_draft_tokens,
            "tau": _r(self.tau),
            "tau_macro": _r(self.tau_macro),
            "tau_full_rounds": _r(self.tau_full_rounds),
            "tau_by_domain": {d: _r(v) for d, v in self.tau_by_domain.items()},
            "rounds_by_domain": self.rounds_by_domain,
            "position_acceptance": [_r(v) for v in self.position_acceptance],
            "position_counts": self.position_counts,
            "num_rounds": self.num_rounds,
            "num_samples": self.num_samples,
            "tau_macro_ci95": [_r(ci[0]), _r(ci[1])] if ci else None,
            **self.extra,
            "per_sample": self.per_sample.to_dict() if self.per_sample else None,
        }


def _r(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def summarize_rounds(
    *, rounds: Rounds, num_samples: int, sample_ids: list[str] | None = None
) -> AcceptanceReport:
    """Pool a walk's rounds per domain and over all of them.

    With `sample_ids` (the id of each walked table, by index) the report also
    carries per-sample sums and a bootstrap interval of the macro tau."""
    import torch

    by_domain: dict[str, list[int]] = {}
    for i, d in enumerate(rounds.domain):
        by_domain.setdefault(d, []).append(i)
    taus = {
        d: tau(accepted=rounds.accepted[torch.tensor(idx)]) for d, idx in sorted(by_domain.items())
    }
    rates, counts = position_acceptance(
        accepted=rounds.accepted, valid=rounds.valid, draft_len=rounds.draft_len
    )
    per_sample = ci = None
    if sample_ids is not None:
        per_sample = per_sample_sums(rounds=rounds, sample_ids=sample_ids)
        ci = macro_tau_interval(per_sample)
    return AcceptanceReport(
        num_draft_tokens=rounds.num_draft_tokens,
        tau=tau(accepted=rounds.accepted),
        tau_macro=sum(taus.values()) / len(taus) if taus else math.nan,
        tau_full_rounds=tau(accepted=rounds.accepted[rounds.full]),
        tau_by_domain=taus,
        rounds_by_domain={d: len(v) for d, v in sorted(by_domain.items())},
        position_acceptance=rates,
        position_counts=counts,
        num_rounds=rounds.num_rounds,
        num_samples=num_samples,
        per_sample=per_sample,
        tau_macro_ci95=ci,
    )


def per_sample_sums(*, rounds: Rounds, sample_ids: list[str]) -> PerSample:
    """Accepted tokens and rounds of every sample that had a round."""
    import torch

    n = len(sample_ids)
    acc = torch.zeros(n, dtype=torch.long).index_add_(0, rounds.sample, rounds.accepted)
    num = torch.zeros(n, dtype=torch.long).index_add_(
        0, rounds.sample, torch.ones_like(rounds.sample)
    )
    domain = [""] * n
    for i, d in zip(rounds.sample.tolist(), rounds.domain, strict=True):
        domain[i] = d
    keep = [i for i in range(n) if int(num[i])]
    return PerSample(
        [sample_ids[i] for i in keep],
        [domain[i] for i in keep],
        [int(acc[i]) for i in keep],
        [int(num[i]) for i in keep],
    )


@dataclass
class AnchorTable:
    """Per sample: the drafted block at every answer position (computed once, walked often)."""

    domain: str
    start: int  # first answer position (first anchor)
    end: int  # trajectory length T
    accepted: torch.Tensor  # (T,) int64 accepted drafts with anchor a (0 outside the answer)
    valid: torch.Tensor  # (T, n) bool drafted position inside the trajectory
    confidence_logit: torch.Tensor | None  # (T, n)
    sample_id: str = ""


ANCHORS_PER_CALL = 64  # bounds the (anchors, block, vocab) logits of one call


def draft_in_chunks(drafter: Drafter, sample: TrainingSample, anchors: torch.Tensor) -> DraftBlocks:
    """`drafter.draft` over `anchors`, ANCHORS_PER_CALL at a time (a real vocabulary
    makes every anchor's block logits large: 500 anchors x 16 x 152k floats is 5 GB)."""
    import torch

    from pipeline.drafts.drafter import DraftBlocks

    parts = [drafter.draft(sample, a) for a in anchors.split(ANCHORS_PER_CALL)]
    conf = [p.confidence_logit for p in parts]
    return DraftBlocks(
        anchors=anchors,
        tokens=torch.cat([p.tokens for p in parts]),
        confidence_logit=None if any(c is None for c in conf) else torch.cat(conf),
    )


def anchor_table(sample: TrainingSample, drafter: Drafter) -> AnchorTable | None:
    """Draft at every answer position of `sample`; None if the answer has < 2 tokens."""
    import torch

    t = int(sample.input_ids.shape[0])
    start = int(sample.num_prompt_tokens)
    if t - 1 - start < 1:
        return None
    n = drafter.num_draft_tokens
    anchors = torch.arange(start, t - 1)
    blocks = draft_in_chunks(drafter, sample, anchors)
    pos = anchors[:, None] + 1 + torch.arange(n)  # (A, n)
    valid = pos < t
    truth = sample.input_ids[pos.clamp(max=t - 1)]
    acc = accepted_lengths(drafted=blocks.tokens, truth=truth, valid=valid)
    accepted = torch.zeros(t, dtype=torch.long)
    accepted[anchors] = acc
    valid_full = torch.zeros(t, n, dtype=torch.bool)
    valid_full[anchors] = valid
    conf = None
    if blocks.confidence_logit is not None:
        conf = torch.zeros(t, n)
        conf[anchors] = blocks.confidence_logit.float()
    return AnchorTable(sample.domain, start, t, accepted, valid_full, conf, sample.sample_id)


def build_tables(samples: Iterable[TrainingSample], drafter: Drafter) -> list[AnchorTable]:
    return [tab for s in samples if (tab := anchor_table(s, drafter)) is not None]


def walk_tables(
    tables: list[AnchorTable],
    *,
    num_draft_tokens: int,
    draft_len: list[torch.Tensor] | None = None,  # per table (T,) tokens sent (truncation)
) -> Rounds:
    """Walk every sample's trajectory and flatten the rounds."""
    import torch

    n = num_draft_tokens
    doms, samp, anc, acc, val, full, dlen, conf = [], [], [], [], [], [], [], []
    for i, tab in enumerate(tables):
        limit = draft_len[i] if draft_len is not None else None
        anchors = torch.tensor(
            walk(accepted=tab.accepted, start=tab.start, end=tab.end, draft_len=limit),
            dtype=torch.long,
        )
        if not anchors.numel():
            continue
        lens = limit[anchors] if limit is not None else torch.full_like(anchors, n)
        doms.extend([tab.domain] * anchors.numel())
        samp.append(torch.full_like(anchors, i))
        anc.append(anchors)
        acc.append(torch.minimum(tab.accepted[anchors], lens))
        val.append(tab.valid[anchors])
        full.append(anchors + n + 1 < tab.end)
        dlen.append(lens)
        if tab.confidence_logit is not None:
            conf.append(tab.confidence_logit[anchors])

    def cat(xs: list, dtype) -> torch.Tensor:
        return torch.cat(xs) if xs else torch.zeros(0, dtype=dtype)

    return Rounds(
        num_draft_tokens=n,
        domain=doms,
        sample=cat(samp, torch.long),
        anchor=cat(anc, torch.long),
        accepted=cat(acc, torch.long),
        valid=torch.cat(val) if val else torch.zeros(0, n, dtype=torch.bool),
        full=cat(full, torch.bool),
        draft_len=cat(dlen, torch.long),
        confidence_logit=torch.cat(conf) if conf and len(conf) == len(anc) else None,
    )


def evaluate_offline(
    samples: Iterable[TrainingSample], drafter: Drafter
) -> tuple[AcceptanceReport, list[AnchorTable]]:
    """T=0 acceptance of `drafter` on these samples' greedy trajectories (+ the tables)."""
    tables = build_tables(samples, drafter)
    rounds = walk_tables(tables, num_draft_tokens=drafter.num_draft_tokens)
    ids = [tab.sample_id for tab in tables]
    return summarize_rounds(rounds=rounds, num_samples=len(tables), sample_ids=ids), tables
