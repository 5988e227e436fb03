"""Warm start: a new draft begins from the tensors a trained draft shares with it.

`init_from` names a trained draft's run directory or checkpoint (a DFlash
draft, typically, for a DSpark one: the speculators recipe's warm start). Every
tensor of that checkpoint whose name the new draft has is copied into it; the
new draft's other tensors (DSpark's Markov and confidence heads, layers past
the source's) keep their initialisation. Both drafts must read the same target
layers and have the same width, and a shared name must have the same shape:
anything else fails in one line before step 0. A run that resumes from its own
checkpoint never warm-starts again (pipeline/train/loop.py).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.drafts.checkpoint import load_checkpoint
from pipeline.logs import kv

if TYPE_CHECKING:
    from torch import nn

    from pipeline.drafts.spec import DraftSpec

log = logging.getLogger(__name__)


def warm_start(model: nn.Module, spec: DraftSpec, init_from: str | Path) -> None:
    """Copy into `model` (a draft of `spec`) the tensors of the draft at `init_from`
    that it shares by name; see the module docstring for what must agree."""
    import torch

    ckpt = load_checkpoint(init_from)
    where = f"train.init_from {init_from}"
    for field in ("hidden_size", "aux_layer_ids", "vocab_size"):
        mine, theirs = getattr(spec, field), getattr(ckpt.spec, field)
        if mine != theirs:
            raise ValueError(f"{where}: its {field} is {theirs}, this draft's is {mine}")
    source = ckpt.model_state()
    own = model.state_dict()
    shared = [name for name in source if name in own]
    for name in shared:
        if source[name].shape != own[name].shape:
            raise ValueError(
                f"{where}: tensor {name} has shape {tuple(source[name].shape)}, this draft's "
                f"{tuple(own[name].shape)}"
            )
    if not shared:
        raise ValueError(f"{where}: it shares no tensor with this draft")
    with torch.no_grad():
        for name in shared:
            own[name].copy_(source[name].to(own[name].dtype))
    log.info(
        "warm start %s",
        kv(
            source=ckpt.path,
            kind=ckpt.spec.kind,
            copied=len(shared),
            initialised=sum(1 for n in own if n not in source),
        ),
    )
