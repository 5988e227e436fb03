"""What the evaluator needs from a draft, whatever its kind: the `Drafter` protocol.

A drafter drafts greedy blocks at given anchors of a sample from its cached
target features (`draft`, the offline T=0 walk), and one block at the end of
a growing sequence (`propose`, the live loop, sampling at T > 0). Both return
`DraftBlocks`. `LiveProposals` gives every drafter the same `propose`: one
anchor, the last committed token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from pipeline.shards.reader import TrainingSample


@dataclass
class DraftBlocks:
    """One drafted block per anchor of one sample (A anchors, n drafted slots)."""

    anchors: torch.Tensor  # (A,) int64 anchor positions a (slot j drafts token a + 1 + j)
    tokens: torch.Tensor  # (A, n) int64 drafted tokens
    confidence_logit: torch.Tensor | None  # (A, n) pre-sigmoid acceptance estimate
    probs: torch.Tensor | None = None  # (A, n, V) draft distribution of each slot (T > 0)


class Drafter(Protocol):
    """What the evaluator needs from a draft: its block length and blocks at given anchors."""

    name: str
    num_draft_tokens: int  # n: tokens drafted per verification round
    has_confidence: bool  # blocks carry confidence logits (a DSpark confidence head)

    def draft(self, sample: TrainingSample, anchors: torch.Tensor) -> DraftBlocks:
        """Greedy (T=0) blocks at `anchors` from the sample's cached target features."""
        ...

    def propose(
        self,
        ids: torch.Tensor,  # (T,) int64 committed tokens; the last one is the anchor
        features: torch.Tensor,  # (T, k*H) target features (the anchor's row unused)
        *,
        temperature: float,
        generator: torch.Generator | None,
    ) -> DraftBlocks:
        """One block drafted at the last position (the live loop); `probs` set when T > 0."""
        ...


class LiveProposals:
    """`propose` for drafters whose `_blocks(ids, features, anchors, ...)` drafts at anchors."""

    def propose(
        self,
        ids: torch.Tensor,
        features: torch.Tensor,
        *,
        temperature: float,
        generator: torch.Generator | None,
    ) -> DraftBlocks:
        import torch

        anchor = torch.tensor([ids.shape[0] - 1])
        return self._blocks(ids, features, anchor, temperature=temperature, generator=generator)
