"""DSpark losses and training metrics: pure keyword-only functions over tensors.

`0.1 CE + 0.9 L1 + 1.0 BCE(confidence, 1 - TV)` (docs/design.md#the-draft-dspark; the DSpark
paper's Eq. 10 and its reference code: L1 = ||p_draft - p_target||_1 = 2 TV),
each slot weighted by `exp(-(k-1)/gamma)` where k is the 1-based index of the
token the slot drafts. The target distribution comes from the stored
post-norm final hidden state through the frozen lm_head. Internally the
distribution term is carried as a weight on TV (`tv_weight` = 2 x the L1
weight), the quantity the metrics and the confidence label use.

Two forms of the same loss:

* `draft_loss` over full (R, Nb, B, V) logits: the dense reference (tests,
  tiny models);
* `chunked_draft_loss` over the final hidden states: logits, target logits and
  their softmaxes exist for `chunk_size` slots at a time, each chunk
  recomputed in backward (activation checkpointing), so no (N, V) fp32 tensor
  of the whole batch is ever held. What the trainer runs.

With a reduced draft vocabulary (pipeline/drafts/vocab.py) the draft's and the
target's logits both cover only its tokens: the target distribution is
restricted to them and renormalised (EAGLE-3's), and `target_ids` are
draft-vocabulary ids, -1 for a token outside it, whose CE term is 0 (the
slot still counts in TV/KL, the normaliser and the acceptance metrics, where
it can never match: `LossParts.outside` counts them).

The EAGLE-3 baseline uses the same function with only the forward-KL term
`KL(p_target || p_draft)` (EAGLE-3's soft-label cross-entropy minus the
target's entropy: same gradient, 0 at a perfect draft) and the step weights
`decay**s`. The weights of each slot or step are the draft kind's
(`DraftKind.step_weights`: `slot_weights` in drafts/dspark/model.py,
`ttt_step_weights` in drafts/eagle3/model.py).

Sums, not means, come back with the normaliser separate, so data-parallel
workers can all-reduce the normaliser first and every worker's share of the
gradient is exact for the global batch (1 worker == N workers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LossParts:
    total: torch.Tensor  # scalar: weighted sum / normaliser (what backward sees)
    ce_sum: torch.Tensor  # scalar: sum over valid slots of w * CE
    tv_sum: torch.Tensor  # scalar: sum of w * TV
    bce_sum: torch.Tensor  # scalar: sum of w * BCE (0 without a confidence head)
    weight_sum: torch.Tensor  # scalar: sum of w over valid slots (the local normaliser)
    tv: torch.Tensor  # (R, Nb, B) per-slot TV (detached; 0 where invalid)
    kl_sum: torch.Tensor | None = None  # scalar: sum of w * KL(target || draft); 0 if unweighted
    match: torch.Tensor | None = None  # (R, Nb, B) bool: argmax of the draft == target token
    # scalar: valid slots whose token is outside a reduced draft vocabulary (their CE is masked)
    outside: torch.Tensor | None = None


def draft_loss(
    *,
    logits: torch.Tensor,  # (R, Nb, B, V) draft logits
    target_logits: torch.Tensor,  # (R, Nb, B, V) target logits for the same tokens
    target_ids: torch.Tensor,  # (R, Nb, B) token each slot drafts (-1: outside the draft vocab)
    valid: torch.Tensor,  # (R, Nb, B) bool: slot drafts a loss-mask token
    weights: torch.Tensor,  # (B,) slot weights (slot_weights)
    confidence_logit: torch.Tensor | None,  # (R, Nb, B)
    ce_weight: float,
    tv_weight: float,
    bce_weight: float,
    normalizer: float | torch.Tensor | None = None,  # global sum of w; None: local
    kl_weight: float = 0.0,  # forward KL(p_target || p_draft), EAGLE-3's loss
) -> LossParts:
    sel = valid.nonzero(as_tuple=True)
    w = weights.to(logits.device)[sel[2]]  # (N,)
    draft = logits[sel].float()  # (N, V)
    target = target_logits[sel].float()  # (N, V)
    logp = F.log_softmax(draft, dim=-1)
    logq = F.log_softmax(target, dim=-1)  # (N, V) target log-probabilities
    q = logq.exp()
    ids = target_ids[sel]
    ce = _masked_ce(logp, ids)  # (N,)
    # TV is always reported (and feeds the confidence head's label); it carries a
    # gradient only when it is a loss term, so CE/KL-only drafts skip its backward.
    p_draft = logp.exp() if tv_weight > 0 else logp.detach().exp()
    tv = 0.5 * (p_draft - q).abs().sum(-1)  # (N,)
    kl = torch.zeros_like(tv)
    if kl_weight > 0:
        kl = (q * (logq - logp)).sum(-1)  # (N,)
    bce = torch.zeros_like(tv)
    if confidence_logit is not None and bce_weight > 0:
        accept = (1.0 - tv).detach().clamp(0.0, 1.0)
        bce = F.binary_cross_entropy_with_logits(
            confidence_logit[sel].float(), accept, reduction="none"
        )
    ce_sum, tv_sum, bce_sum = (w * ce).sum(), (w * tv).sum(), (w * bce).sum()
    kl_sum = (w * kl).sum()
    weight_sum = w.sum().detach()
    norm = weight_sum if normalizer is None else normalizer
    norm = torch.as_tensor(norm, dtype=torch.float32, device=draft.device).clamp_min(1e-8)
    total = (
        ce_weight * ce_sum + tv_weight * tv_sum + bce_weight * bce_sum + kl_weight * kl_sum
    ) / norm
    tv_full = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
    tv_full[sel] = tv.detach()
    match = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
    match[sel] = draft.argmax(-1) == ids
    return LossParts(
        total,
        ce_sum.detach(),
        tv_sum.detach(),
        bce_sum.detach(),
        weight_sum,
        tv_full,
        kl_sum.detach(),
        match,
        (ids < 0).sum().float(),
    )


def _masked_ce(logp: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(n, Vd), (n,) -> (n,) cross-entropy of each slot's token; 0 for a token outside
    a reduced draft vocabulary (id -1: the draft cannot propose it, nothing to learn)."""
    inside = ids >= 0
    ce = -logp.gather(-1, ids.clamp(min=0)[:, None]).squeeze(-1)
    return torch.where(inside, ce, torch.zeros_like(ce))


def _slot_terms(
    hidden: torch.Tensor,  # (n, d)
    markov: torch.Tensor | None,  # (n, r)
    teacher_hidden: torch.Tensor,  # (n, H)
    ids: torch.Tensor,  # (n,)
    *,
    logits_fn: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
    teacher_fn: Callable[[torch.Tensor], torch.Tensor],
    tv_grad: bool,
    with_kl: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ce, tv, kl, match) of n slots; the (n, V) tensors live only inside this call."""
    logp = F.log_softmax(logits_fn(hidden, markov).float(), dim=-1)  # (n, V)
    with torch.no_grad():
        logq = F.log_softmax(teacher_fn(teacher_hidden).float(), dim=-1)
        match = logp.argmax(-1) == ids
    ce = _masked_ce(logp, ids)
    p = logp.exp() if tv_grad else logp.detach().exp()
    tv = 0.5 * (p - logq.exp()).abs().sum(-1)
    kl = (logq.exp() * (logq - logp)).sum(-1) if with_kl else torch.zeros_like(tv)
    return ce, tv, kl, match


def chunked_draft_loss(
    *,
    hidden: torch.Tensor,  # (R, Nb, B, d) the draft's final hidden states
    markov: torch.Tensor | None,  # (R, Nb, B, r) the Markov head's input W1[prev]
    teacher_hidden: torch.Tensor,  # (R, Nb, B, H) target's post-norm state for each slot
    logits_fn: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],  # (n,d),(n,r)->(n,V)
    teacher_fn: Callable[[torch.Tensor], torch.Tensor],  # (n, H) -> (n, V) target logits
    target_ids: torch.Tensor,  # (R, Nb, B) draft-vocabulary ids (-1: outside it)
    valid: torch.Tensor,  # (R, Nb, B) bool
    weights: torch.Tensor,  # (B,)
    confidence_logit: torch.Tensor | None,  # (R, Nb, B)
    ce_weight: float,
    tv_weight: float,
    bce_weight: float,
    normalizer: float | torch.Tensor | None = None,
    kl_weight: float = 0.0,
    chunk_size: int = 1024,
) -> LossParts:
    """`draft_loss` computed `chunk_size` valid slots at a time (module docstring)."""
    from torch.utils.checkpoint import checkpoint

    sel = valid.nonzero(as_tuple=True)
    w = weights.to(hidden.device)[sel[2]]  # (N,)
    h, ids, th = hidden[sel], target_ids[sel], teacher_hidden[sel]
    m = None if markov is None else markov[sel]
    terms = dict(
        logits_fn=logits_fn, teacher_fn=teacher_fn, tv_grad=tv_weight > 0, with_kl=kl_weight > 0
    )
    parts: list[tuple[torch.Tensor, ...]] = []
    # At least one (possibly empty) chunk: every weight then takes part in the graph,
    # as data-parallel wrappers expect, even for a batch without a valid slot.
    for i in range(0, max(h.shape[0], 1), chunk_size):
        c = slice(i, i + chunk_size)
        args = (h[c], None if m is None else m[c], th[c], ids[c])
        if torch.is_grad_enabled() and h.requires_grad:
            parts.append(checkpoint(_slot_terms, *args, use_reentrant=False, **terms))
        else:
            parts.append(_slot_terms(*args, **terms))
    ce, tv, kl, match_sel = (torch.cat(x) for x in zip(*parts, strict=True))
    bce = torch.zeros_like(tv)
    if confidence_logit is not None and bce_weight > 0:
        accept = (1.0 - tv).detach().clamp(0.0, 1.0)
        bce = F.binary_cross_entropy_with_logits(
            confidence_logit[sel].float(), accept, reduction="none"
        )
    ce_sum, tv_sum, bce_sum, kl_sum = ((w * x).sum() for x in (ce, tv, bce, kl))
    weight_sum = w.sum().detach()
    norm = weight_sum if normalizer is None else normalizer
    norm = torch.as_tensor(norm, dtype=torch.float32, device=h.device).clamp_min(1e-8)
    total = (
        ce_weight * ce_sum + tv_weight * tv_sum + bce_weight * bce_sum + kl_weight * kl_sum
    ) / norm
    tv_full = torch.zeros(valid.shape, dtype=torch.float32, device=valid.device)
    tv_full[sel] = tv.detach()
    match = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
    match[sel] = match_sel
    return LossParts(
        total,
        ce_sum.detach(),
        tv_sum.detach(),
        bce_sum.detach(),
        weight_sum,
        tv_full,
        kl_sum.detach(),
        match,
        (ids < 0).sum().float(),
    )


@dataclass
class BlockStats:
    """Sums over a batch; add them up (or all-reduce) and divide at logging time."""

    correct: torch.Tensor  # (B,) argmax == target, per slot
    count: torch.Tensor  # (B,) valid slots
    tv: torch.Tensor  # (B,) sum of TV per slot
    tau_tv: torch.Tensor  # scalar: sum over full blocks of 1 + sum_k prod_{i<=k} (1 - TV_i)
    tau_greedy: torch.Tensor  # scalar: same with exact-match acceptance (T=0)
    num_blocks: torch.Tensor  # scalar: full blocks

    def vector(self) -> torch.Tensor:
        return torch.cat(
            [
                self.correct,
                self.count,
                self.tv,
                self.tau_tv[None],
                self.tau_greedy[None],
                self.num_blocks[None],
            ]
        )

    @classmethod
    def from_vector(cls, v: torch.Tensor, block_size: int) -> BlockStats:
        b = block_size
        return cls(v[:b], v[b : 2 * b], v[2 * b : 3 * b], v[3 * b], v[3 * b + 1], v[3 * b + 2])


@torch.no_grad()
def block_stats(
    *,
    match: torch.Tensor,  # (R, Nb, B) bool: the draft's argmax is the target token
    valid: torch.Tensor,  # (R, Nb, B) bool
    tv: torch.Tensor,  # (R, Nb, B) per-slot TV from draft_loss
    first_offset: int,
) -> BlockStats:
    """Accuracy per block position and the teacher-forced acceptance length.

    A block counts for tau only if every drafting slot is valid (blocks cut
    by the end of the answer would bias tau down).
    """
    slots = slice(1 - first_offset, None)  # drafting slots
    match = match & valid
    validf = valid.float()
    full = valid[..., slots].all(-1)  # (R, Nb)
    accept_tv = torch.cumprod((1.0 - tv[..., slots]).clamp(0, 1), dim=-1)  # (R, Nb, n)
    accept_greedy = torch.cumprod(match[..., slots].float(), dim=-1)
    return BlockStats(
        correct=match.float().sum((0, 1)),
        count=validf.sum((0, 1)),
        tv=(tv * validf).sum((0, 1)),
        tau_tv=((1.0 + accept_tv.sum(-1)) * full).sum(),
        tau_greedy=((1.0 + accept_greedy.sum(-1)) * full).sum(),
        num_blocks=full.float().sum(),
    )


def summarize(*, stats: BlockStats, first_offset: int) -> dict[str, float]:
    """Loggable numbers from summed BlockStats."""
    out: dict[str, float] = {}
    blocks = max(float(stats.num_blocks), 1.0)
    out["tau_tv"] = float(stats.tau_tv) / blocks
    out["tau_greedy"] = float(stats.tau_greedy) / blocks
    for s in range(1 - first_offset, stats.count.numel()):
        n = float(stats.count[s])
        k = s + first_offset
        out[f"acc_{k}"] = float(stats.correct[s]) / n if n else math.nan
    return out
