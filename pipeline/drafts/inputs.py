"""A draft's input batch and forward output, the shape every draft kind shares.

`DraftInputs` is one packed batch as a draft sees it (pipeline/train/packing.py
packs it, the evaluators build it per sample); `DraftOutput` is what a
draft's forward returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftInputs:
    """One packed batch as the model sees it (R rows, Tc context slots, Nb blocks of B).

    Padding: context slots with ctx_doc == -1 and blocks with block_doc == -1.
    """

    ctx_features: torch.Tensor  # (R, Tc, k*H) captured target layers
    ctx_positions: torch.Tensor  # (R, Tc) int64, position within its own sample
    ctx_doc: torch.Tensor  # (R, Tc) int64, sample index within the row, -1 = pad
    block_ids: torch.Tensor  # (R, Nb, B) int64, [anchor token, mask, ..., mask]
    block_anchor: torch.Tensor  # (R, Nb) int64, anchor position a within its sample
    block_doc: torch.Tensor  # (R, Nb) int64, sample index within the row, -1 = pad
    prev_ids: torch.Tensor  # (R, Nb, B) int64, token before each slot's target (Markov input)
    # (R, Tc) int64, the token at each context slot (0 at padding); EAGLE-3 feeds
    # token j+1 beside the features of token j. None where no caller needs it.
    ctx_ids: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> DraftInputs:
        return DraftInputs(
            **{k: None if v is None else v.to(device) for k, v in self.__dict__.items()}
        )


@dataclass
class DraftOutput:
    # (R, Nb, B, V) draft logits incl. the Markov bias; None when the forward ran
    # with `with_logits=False` (training: the loss builds logits chunk by chunk).
    logits: torch.Tensor | None
    base_logits: torch.Tensor | None  # (R, Nb, B, V) the backbone alone (DFlash path)
    hidden: torch.Tensor  # (R, Nb, B, d) after the final norm
    confidence_logit: torch.Tensor | None  # (R, Nb, B) pre-sigmoid acceptance estimate
    markov: torch.Tensor | None = None  # (R, Nb, B, r) W1[prev]: the Markov head's input
