"""Load a trained draft to evaluate: from a run directory, a checkpoint or an export.

A draft loads from a training run directory (`<out_dir>`, whose
`checkpoints/latest` is used), a checkpoint directory (`spec.json` +
`state.pt`), or a speculators-format export (`config.json` +
`model.safetensors`, what vLLM serves). The formats are read by their owners,
checkpoint.py and export.py beside this module; the module is built by the
table of kinds (registry.py). `untrained=True` keeps the architecture and
draws fresh weights (seeded): the floor every trained draft must beat.
Embeddings and lm_head always come from the target.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.drafts.checkpoint import find_checkpoint, load_checkpoint
from pipeline.drafts.export import export_target, is_export, read_export
from pipeline.drafts.registry import KINDS, build_draft, draft_kind

if TYPE_CHECKING:
    import torch
    from torch import nn

    from pipeline.drafts.drafter import Drafter
    from pipeline.drafts.spec import DraftSpec


@dataclass
class LoadedDraft:
    model: nn.Module  # the kind's draft module, in eval mode
    spec: DraftSpec
    source: Path  # what it was loaded from
    export_dir: Path | None  # where calibration is stored beside the served draft
    train_config: dict | None  # the training run's config (None for an export)


def load_draft(
    path: str | Path,
    *,
    target_dir: str | Path,
    untrained: bool = False,
    seed: int = 0,
    target_head: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> LoadedDraft:
    """Load a draft (see the module docstring); embeddings and lm_head come from the target
    (`target_head`: the target's (embed, lm_head), already loaded, for several drafts)."""
    import torch

    from pipeline.drafts.target_head import load_target_head

    path = Path(path)
    embed, head = target_head or load_target_head(target_dir)
    found = find_checkpoint(path)  # a dangling `latest` pointer is an error, named
    train_config = None
    if found is not None:
        ckpt = load_checkpoint(found)
        spec, train_config = ckpt.spec, ckpt.train_config
        state = None if untrained else ckpt.model_state()
        export_dir = ckpt.export_dir if is_export(ckpt.export_dir) else None
    elif is_export(path):
        spec, state = read_export(path, weights=not untrained)
        export_dir = path
    else:
        raise FileNotFoundError(
            f"{path}: not a training run (checkpoints/latest), a checkpoint (spec.json + "
            "state.pt) or a speculators export (config.json + model.safetensors)"
        )
    try:
        draft_kind(spec.kind)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    if embed.shape[0] != spec.vocab_size or embed.shape[1] != spec.hidden_size:
        raise ValueError(
            f"{path}: draft expects vocab {spec.vocab_size} x hidden {spec.hidden_size}, "
            f"target {target_dir} has embeddings {tuple(embed.shape)}"
        )
    torch.manual_seed(seed)
    model = build_draft(spec, embed, head)
    if state is not None:
        missing, unexpected = model.load_state_dict(
            {k: v.float() if v.is_floating_point() else v for k, v in state.items()},
            strict=False,
        )
        if missing or unexpected:
            raise ValueError(f"{path}: tensors missing {missing}, unexpected {unexpected}")
    model.eval()
    return LoadedDraft(model, spec, path, export_dir, train_config)


def draft_target(path: str | Path) -> str:
    """The target a training run, checkpoint or export was trained against."""
    found = find_checkpoint(path)
    return load_checkpoint(found).target if found is not None else export_target(path)


def make_drafter(name: str, draft: LoadedDraft, *, use_heads: bool = True) -> Drafter:
    """The evaluator's drafter of a loaded draft, by its kind. `use_heads=False` drafts
    with the backbone alone; a draft without heads ignores it."""
    kind = KINDS.get(draft.spec.kind)
    if kind is None:
        raise ValueError(
            f"{draft.source}: no drafter for draft kind {draft.spec.kind!r}; known: {sorted(KINDS)}"
        )
    return kind.drafter(name, draft.model, use_heads)
