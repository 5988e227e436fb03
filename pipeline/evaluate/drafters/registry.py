"""Which drafter drafts each draft kind: the evaluation side of the table of kinds.

pipeline/train/drafts/registry.py says how each kind is built, trained and
exported; this says how the evaluator drafts with it. DFlash drafts with the
DSpark drafter (its blocks, without heads); EAGLE-3 with its step loop. The
keys must be the training registry's kinds (tests/evaluate/drafters checks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.evaluate.drafters.dspark import DSparkDrafter
from pipeline.evaluate.drafters.eagle3 import Eagle3Drafter

if TYPE_CHECKING:
    from torch import nn

    from pipeline.evaluate.drafters.base import Drafter
    from pipeline.evaluate.drafters.load import LoadedDraft

# kind -> (report name, draft module, use_heads) -> Drafter. `use_heads=False`
# drafts with the backbone alone; a draft without heads ignores it.
DRAFTERS: dict[str, Callable[[str, nn.Module, bool], Drafter]] = {
    "dspark": lambda name, model, use_heads: DSparkDrafter(name, model, use_heads=use_heads),
    "dflash": lambda name, model, use_heads: DSparkDrafter(name, model, use_heads=use_heads),
    "eagle3": lambda name, model, use_heads: Eagle3Drafter(name, model),
}


def make_drafter(name: str, draft: LoadedDraft, *, use_heads: bool = True) -> Drafter:
    """The drafter of a loaded draft's kind (see the module docstring)."""
    kind = draft.spec.kind
    if kind not in DRAFTERS:
        raise ValueError(
            f"{draft.source}: no drafter for draft kind {kind!r}; known: {sorted(DRAFTERS)}"
        )
    return DRAFTERS[kind](name, draft.model, use_heads)
