"""EAGLE-3 drafts as the evaluator sees them: K autoregressive steps per round.

vLLM's `eagle3` method, for the anchor a (the token just committed, root
p = a-1): step 0 reads [embed(x_a) ; fc(features of p)] at position p, step
s >= 1 reads the token the draft chose at step s-1 and its own previous
pre-norm output, at position p+s (`Eagle3Draft.unroll`, free-running). Each
anchor's chain is independent of the others, so the blocks at every anchor
of a sample run as one batch: row = the sample, one block per anchor.

Offline at T=0 the free-running chain drafts exactly what vLLM would draft
from the same features; accepting its matching prefix gives the same
accepted length as teacher forcing would (step s only counts when steps < s
matched the trajectory, i.e. when the draft's own tokens were the
trajectory's), which tests/drafts/eagle3/test_drafter.py checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.drafts.drafter import DraftBlocks, LiveProposals

if TYPE_CHECKING:
    import torch

    from pipeline.drafts.eagle3.model import Eagle3Draft
    from pipeline.drafts.inputs import DraftInputs
    from pipeline.shards.reader import TrainingSample


def eagle3_inputs(
    ids: torch.Tensor,  # (T,) int64 tokens (context + anchors)
    features: torch.Tensor,  # (T, k*H) captured target layers (rows >= the anchor unused)
    anchors: torch.Tensor,  # (A,) int64 anchor positions, each >= 1
    steps: int,
) -> DraftInputs:
    """One row: the sample as context, one K-step block per anchor.

    `prev_ids[0, i, s]` is the trajectory's token a_i + s (clamped at the
    end): step 0 reads the anchor; later steps read it only when
    teacher-forced."""
    import torch

    from pipeline.drafts.inputs import DraftInputs

    t, a = ids.shape[0], anchors.shape[0]
    if a and int(anchors.min()) < 1:
        raise ValueError("an EAGLE-3 anchor needs a root position before it (anchor >= 1)")
    pos = (anchors[:, None] + torch.arange(steps)).clamp(max=t - 1)
    return DraftInputs(
        ctx_features=features[None],
        ctx_positions=torch.arange(t)[None],
        ctx_doc=torch.zeros(1, t, dtype=torch.long),
        block_ids=torch.zeros(1, a, steps, dtype=torch.long),
        block_anchor=anchors[None],
        block_doc=torch.zeros(1, a, dtype=torch.long),
        prev_ids=ids[pos][None],
        ctx_ids=ids[None],
    )


@dataclass
class Eagle3Drafter(LiveProposals):
    """An `Eagle3Draft` as a Drafter (no heads: nothing to calibrate)."""

    name: str
    model: Eagle3Draft
    has_confidence: bool = False

    @property
    def num_draft_tokens(self) -> int:
        return self.model.spec.block_size  # unrolled steps = vLLM's num_speculative_tokens

    def _blocks(
        self,
        ids: torch.Tensor,
        features: torch.Tensor,
        anchors: torch.Tensor,
        *,
        teacher_forced: bool = False,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> DraftBlocks:
        import torch

        inputs = eagle3_inputs(ids, features, anchors, self.num_draft_tokens)
        with torch.no_grad():
            _, logits, tokens = self.model.unroll(
                inputs,
                free_running=not teacher_forced,
                temperature=temperature,
                generator=generator,
            )
        probs = None
        if temperature > 0:  # over the target vocabulary (0 outside a reduced draft vocabulary)
            probs = self.model.to_target_vocab(torch.softmax(logits[0].float() / temperature, -1))
        return DraftBlocks(anchors=anchors, tokens=tokens[0], confidence_logit=None, probs=probs)

    def draft(
        self, sample: TrainingSample, anchors: torch.Tensor, *, teacher_forced: bool = False
    ) -> DraftBlocks:
        """Greedy blocks at `anchors`; `teacher_forced` feeds the trajectory's tokens instead."""
        return self._blocks(
            sample.input_ids, sample.hidden_states, anchors, teacher_forced=teacher_forced
        )
