"""The draft and its training loss as one module: what DDP and FSDP wrap.

`DraftObjective(model)(batch, normalizer)` runs the draft without its
vocabulary-sized logits (`with_logits=False`), gathers the target's stored
post-norm hidden state for each block slot, and computes the kind's loss
chunk by chunk (`loss.chunked_draft_loss`) with the draft's own heads
(`output_logits`: frozen lm_head, soft-cap, Markov bias) and the target's
(`teacher_logits`; with a reduced draft vocabulary both cover only its
tokens, and each slot's token becomes its draft id, -1 outside it). Every parameter is used inside this `forward`, so a
data-parallel wrapper around it sees the whole step (DDP's gradient hooks,
FSDP's all-gathers and reshards) and nothing touches a weight outside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from pipeline.train.loss import LossParts, chunked_draft_loss

if TYPE_CHECKING:
    from pipeline.train.packing import TrainBatch


class DraftObjective(nn.Module):
    """`model` (a TargetHeadDraft) and its weighted loss; see the module docstring."""

    def __init__(
        self,
        model: nn.Module,
        *,
        slot_weights: torch.Tensor,  # (B,) weight of each block slot / unrolled step
        loss_weights: tuple[float, float, float, float],  # ce, tv, bce, kl
        chunk_size: int,
    ) -> None:
        super().__init__()
        self.model = model
        self.slot_weights = slot_weights  # a plain tensor: never broadcast, never saved
        self.loss_weights = loss_weights
        self.chunk_size = chunk_size

    def forward(
        self, batch: TrainBatch, normalizer: torch.Tensor | float | None = None
    ) -> LossParts:
        model = self.model
        out = model(batch.inputs, with_logits=False)
        ce, tv, bce, kl = self.loss_weights
        return chunked_draft_loss(
            hidden=out.hidden,
            markov=out.markov,
            teacher_hidden=batch.teacher_hidden(),
            logits_fn=model.output_logits,
            teacher_fn=model.teacher_logits,
            target_ids=model.to_draft_ids(batch.target_ids),
            valid=batch.valid,
            weights=self.slot_weights.to(out.hidden.device),
            confidence_logit=out.confidence_logit,
            ce_weight=ce,
            tv_weight=tv,
            bce_weight=bce,
            kl_weight=kl,
            normalizer=normalizer,
            chunk_size=self.chunk_size,
        )
