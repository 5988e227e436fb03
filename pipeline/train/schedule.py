"""The loss weights of a step: the configured mix, or a CE-first ramp into it.

`loss.ce_first_fraction` f > 0 starts a run on cross-entropy alone and moves the
weights linearly to the configured mix over the first f x num_steps steps:

    r(s) = min(1, s / (f N))                       s: 0-based step, N: num_steps
    ce(s) = 1 - r(s) (1 - ce)        tv(s) = r(s) tv        bce, kl: as configured

CE moves the greedy token fastest from a fresh draft (docs/train.md, DSpark
against DFlash at small budgets); the distribution term then shapes the rest of
the distribution, which rejection sampling at T > 0 reads. f = 0 is the
configured mix from step 0.
"""

from __future__ import annotations

LossWeights = tuple[float, float, float, float]  # ce, tv, bce, kl


def step_loss_weights(
    weights: LossWeights, *, step: int, num_steps: int, ce_first_fraction: float
) -> LossWeights:
    """The (ce, tv, bce, kl) weights step `step` (0-based) trains with."""
    ce, tv, bce, kl = weights
    ramp = ce_first_fraction * num_steps
    if ramp <= 0 or step >= ramp:
        return weights
    r = step / ramp
    return (1.0 - r * (1.0 - ce), r * tv, bce, kl)
