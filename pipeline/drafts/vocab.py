"""A reduced draft vocabulary: which target tokens the draft's head can propose, and its maps.

A draft head over all of a real target's vocabulary (49,152 rows for
SmolLM2, 151,936 for Qwen3) costs most of a small draft's compute. The
field's lever (EAGLE-3, speculators, vLLM) is a draft vocabulary of the
`draft_vocab_size` target tokens most frequent in the training answers:
the draft's logits cover only those, and a drafted id is mapped back to a
target id before verification. Tokens outside it are never proposed; the
target still generates them, so the output is unchanged, only acceptance
can drop there.

The draft vocabulary is a sorted tuple of target ids (`DraftSpec.draft_vocab`);
the speculators format stores it as two tensors, which this module builds and
reads:

* `d2t` (int64, draft_vocab_size): target_id = draft_id + d2t[draft_id];
* `t2d` (bool, target vocab_size): whether a target token is in the draft vocabulary.

Selection (`select_draft_vocab`): tokens by count, descending, ties broken
by the smaller id (deterministic); `always` tokens (the end-of-turn tokens a
draft must be able to propose) are in whatever their count; a vocabulary
larger than the tokens ever seen is filled with the smallest unseen ids, as
speculators does. No torch at import.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import torch


def select_draft_vocab(
    counts: np.ndarray,  # (V,) occurrences of each target token in the training answers
    size: int,
    *,
    always: Iterable[int] = (),
) -> tuple[int, ...]:
    """The `size` target ids of the draft vocabulary, sorted (module docstring)."""
    import numpy as np

    counts = np.asarray(counts)
    vocab_size = counts.shape[0]
    always = sorted({int(t) for t in always})
    if not 0 < size <= vocab_size:
        raise ValueError(f"draft_vocab_size {size}: must be in 1..{vocab_size} (the target's)")
    if any(not 0 <= t < vocab_size for t in always):
        raise ValueError(f"tokens {always} to keep are not all below vocab size {vocab_size}")
    if len(always) > size:
        raise ValueError(f"draft_vocab_size {size} cannot hold the {len(always)} tokens {always}")
    # Count descending, then id ascending: a stable sort of -counts over ids 0..V-1.
    order = np.argsort(-counts.astype(np.int64), kind="stable")
    chosen = set(always)
    for token in order.tolist():
        if len(chosen) >= size:
            break
        chosen.add(token)
    return tuple(sorted(chosen))


def d2t_of(draft_vocab: Sequence[int]) -> torch.Tensor:
    """(Vd,) int64 offsets: target_id = draft_id + d2t[draft_id]."""
    import torch

    ids = torch.tensor(list(draft_vocab), dtype=torch.long)
    return ids - torch.arange(ids.shape[0], dtype=torch.long)


def t2d_of(draft_vocab: Sequence[int], vocab_size: int) -> torch.Tensor:
    """(V,) bool: the target tokens in the draft vocabulary."""
    import torch

    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[torch.tensor(list(draft_vocab), dtype=torch.long)] = True
    return t2d


def vocab_from_maps(d2t: torch.Tensor, t2d: torch.Tensor | None = None) -> tuple[int, ...]:
    """The draft vocabulary (sorted target ids) a `d2t` tensor encodes, checked against
    `t2d` when given; ValueError if they disagree or the ids are not increasing."""
    import torch

    ids = (torch.arange(d2t.shape[0], dtype=torch.long) + d2t.long()).tolist()
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
        raise ValueError("d2t does not map draft ids to increasing target ids")
    if t2d is not None:
        if ids and (ids[0] < 0 or ids[-1] >= t2d.shape[0]):
            raise ValueError(f"d2t maps outside the target vocabulary of {t2d.shape[0]}")
        if torch.nonzero(t2d.bool()).flatten().tolist() != ids:
            raise ValueError("d2t and t2d name different draft vocabularies")
    return tuple(ids)


def coverage(counts: np.ndarray, draft_vocab: Sequence[int]) -> float:
    """Share of the counted tokens that the draft vocabulary holds (1.0 when none counted)."""
    import numpy as np

    counts = np.asarray(counts)
    total = int(counts.sum())
    return float(counts[list(draft_vocab)].sum()) / total if total else 1.0
