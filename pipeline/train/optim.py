"""The optimiser and learning-rate schedule of the trainer (docs/design.md#the-draft-dspark).

AdamW over the draft's trainable parameters (the target's embeddings and
lm_head are buffers, never optimised) and a linear warmup followed by a
cosine decay to `min_lr_fraction`, stepped once per optimiser step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pipeline.train.config import OptimConfig

if TYPE_CHECKING:
    import torch


def lr_lambda(
    step: int, *, num_steps: int, warmup_fraction: float, min_lr_fraction: float
) -> float:
    """The learning rate of `step` as a fraction of the peak."""
    warmup = int(math.ceil(warmup_fraction * num_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, num_steps - warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return min_lr_fraction + (1.0 - min_lr_fraction) * cosine


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimConfig
) -> torch.optim.Optimizer:
    import torch

    return torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=(config.beta1, config.beta2),
        weight_decay=config.weight_decay,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: OptimConfig, *, num_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    import torch

    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: lr_lambda(
            s,
            num_steps=num_steps,
            warmup_fraction=config.warmup_fraction,
            min_lr_fraction=config.min_lr_fraction,
        ),
    )
