"""DSpark losses and training metrics: pure keyword-only functions over tensors.

`0.1 CE + 0.9 TV + 1.0 BCE(confidence, 1 - TV)` (DESIGN.md §6), each slot
weighted by `exp(-(k-1)/gamma)` where k is the 1-based index of the token the
slot drafts. The target distribution comes from the stored post-norm final
hidden state through the frozen lm_head (the caller passes those logits).

The EAGLE-3 baseline uses the same function with only the forward-KL term
`KL(p_target || p_draft)` (EAGLE-3's soft-label cross-entropy minus the
target's entropy: same gradient, 0 at a perfect draft) and the step weights
`decay**s` of `ttt_step_weights`.

Sums, not means, come back with the normaliser separate, so data-parallel
workers can all-reduce the normaliser first and every worker's share of the
gradient is exact for the global batch (1 worker == N workers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def slot_weights(*, block_size: int, first_offset: int, gamma: float) -> torch.Tensor:
    """(B,) weight per query slot: exp(-(k-1)/gamma) with k = slot + first_offset; 0 if k < 1."""
    k = torch.arange(block_size, dtype=torch.float32) + first_offset
    w = torch.exp(-(k - 1) / gamma)
    return torch.where(k >= 1, w, torch.zeros_like(w))


def ttt_step_weights(*, num_steps: int, decay: float) -> torch.Tensor:
    """(num_steps,) EAGLE-3 weight of unrolled step s (0-based): decay**s (0.8 in EAGLE-3)."""
    return decay ** torch.arange(num_steps, dtype=torch.float32)


@dataclass
class LossParts:
    total: torch.Tensor  # scalar: weighted sum / normaliser (what backward sees)
    ce_sum: torch.Tensor  # scalar: sum over valid slots of w * CE
    tv_sum: torch.Tensor  # scalar: sum of w * TV
    bce_sum: torch.Tensor  # scalar: sum of w * BCE (0 without a confidence head)
    weight_sum: torch.Tensor  # scalar: sum of w over valid slots (the local normaliser)
    tv: torch.Tensor  # (R, Nb, B) per-slot TV (detached; 0 where invalid)
    kl_sum: torch.Tensor | None = None  # scalar: sum of w * KL(target || draft); 0 if unweighted


def draft_loss(
    *,
    logits: torch.Tensor,  # (R, Nb, B, V) draft logits
    target_logits: torch.Tensor,  # (R, Nb, B, V) target logits for the same tokens
    target_ids: torch.Tensor,  # (R, Nb, B) token each slot drafts
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
    ce = -logp.gather(-1, target_ids[sel][:, None]).squeeze(-1)  # (N,)
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
    return LossParts(
        total,
        ce_sum.detach(),
        tv_sum.detach(),
        bce_sum.detach(),
        weight_sum,
        tv_full,
        kl_sum.detach(),
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
    logits: torch.Tensor,  # (R, Nb, B, V)
    target_ids: torch.Tensor,  # (R, Nb, B)
    valid: torch.Tensor,  # (R, Nb, B) bool
    tv: torch.Tensor,  # (R, Nb, B) per-slot TV from draft_loss
    first_offset: int,
) -> BlockStats:
    """Accuracy per block position and the teacher-forced acceptance length.

    A block counts for tau only if every drafting slot is valid (blocks cut
    by the end of the answer would bias tau down).
    """
    slots = slice(1 - first_offset, None)  # drafting slots
    match = (logits.argmax(-1) == target_ids) & valid
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
