"""DSpark and DFlash drafts as the evaluator drafts with them: blocks, left to right.

Drafting is left to right, as DSpark samples: slot k's logits are the
backbone's plus the Markov bias `W2(W1[prev])`, where `prev` is the token the
draft itself just produced (the anchor for the first drafted slot). The
confidence head sees that same `prev`. The backbone runs once for every
anchor of a sample (the context mask hides features at positions >= the
anchor, so this equals calling it once per verification round); only the
Markov step is sequential, over the few drafted slots. A DFlash draft (no
heads) is the same loop without the bias.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.drafts.drafter import DraftBlocks, LiveProposals

if TYPE_CHECKING:
    import torch

    from pipeline.drafts.dspark.model import DSparkDraft
    from pipeline.drafts.spec import DraftSpec
    from pipeline.shards.reader import TrainingSample


def drafting_slots(spec: DraftSpec) -> slice:
    """Block slots that draft a token (fill-in layout: slot 0 is the anchor and drafts nothing)."""
    return slice(1 - spec.first_offset, spec.block_size)


def sample_slots(
    *,
    base_logits: torch.Tensor,  # (N, n, Vd) backbone logits of the drafting slots
    hidden: torch.Tensor,  # (N, n, d) final-norm hidden states of the drafting slots
    first_prev: torch.Tensor,  # (N,) int64 token before the first drafted slot (the anchor)
    model: DSparkDraft,
    use_heads: bool = True,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
) -> DraftBlocks:
    """Left-to-right drafting with the Markov bias on the draft's own previous token.

    `use_heads=False` drafts with the backbone alone (what vLLM's dflash method
    serves for a DSpark draft's backbone). At temperature 0 each slot takes the
    argmax; above it, slot k samples from softmax(logits / T) and its
    distribution is returned for rejection sampling. With a reduced draft
    vocabulary each drafted id is mapped to its target id (d2t) before it is
    returned or fed to the Markov head as the next `prev`.
    """
    import torch

    n = base_logits.shape[1]
    markov = model.markov_head if use_heads else None
    conf_head = model.confidence_head if use_heads else None
    prev = first_prev
    tokens, probs, conf = [], [], []
    for k in range(n):
        logits = base_logits[:, k].float()  # (N, V)
        emb = None
        if markov is not None:
            emb = markov.markov_w1(prev)  # (N, r)
            logits = logits + markov.markov_w2(emb).float()
        if conf_head is not None:
            feats = hidden[:, k].float()
            if model.spec.confidence_with_markov and emb is not None:
                feats = torch.cat([feats, emb.float()], dim=-1)
            conf.append(conf_head.proj(feats).squeeze(-1))  # (N,)
        if temperature > 0:
            p = torch.softmax(logits / temperature, dim=-1)
            tok = torch.multinomial(p, 1, generator=generator).squeeze(-1)
            probs.append(model.to_target_vocab(p))  # (N, V): 0 outside the draft vocabulary
        else:
            tok = logits.argmax(-1)
        tok = model.to_target_ids(tok)  # a reduced draft vocabulary's ids -> target ids
        tokens.append(tok)
        prev = tok
    return DraftBlocks(
        anchors=torch.empty(0, dtype=torch.long),
        tokens=torch.stack(tokens, 1),
        confidence_logit=torch.stack(conf, 1) if conf else None,
        probs=torch.stack(probs, 1) if probs else None,
    )


def run_blocks(
    model: DSparkDraft,
    input_ids: torch.Tensor,  # (T,) int64 tokens (context + anchors)
    features: torch.Tensor,  # (T, k*H) captured target layers (rows >= the anchor unused)
    anchors: torch.Tensor,  # (A,) int64 anchor positions
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backbone outputs of the drafting slots: (base_logits (A, n, Vd), hidden (A, n, d))."""
    import torch

    from pipeline.drafts.inputs import DraftInputs

    spec = model.spec
    t, a, b = input_ids.shape[0], anchors.shape[0], spec.block_size
    block_ids = torch.full((1, a, b), spec.mask_token_id, dtype=torch.long)
    block_ids[0, :, 0] = input_ids[anchors]
    inputs = DraftInputs(
        ctx_features=features[None],
        ctx_positions=torch.arange(t)[None],
        ctx_doc=torch.zeros(1, t, dtype=torch.long),
        block_ids=block_ids,
        block_anchor=anchors[None],
        block_doc=torch.zeros(1, a, dtype=torch.long),
        prev_ids=torch.zeros(1, a, b, dtype=torch.long),  # Markov runs in sample_slots
    )
    with torch.no_grad():
        out = model(inputs)
    slots = drafting_slots(spec)
    return out.base_logits[0, :, slots], out.hidden[0, :, slots]


@dataclass
class DSparkDrafter(LiveProposals):
    """A DSpark or DFlash draft as a Drafter. `use_heads=False`: the backbone alone
    (Markov and confidence heads off: what vLLM's dflash method serves)."""

    name: str
    model: DSparkDraft
    use_heads: bool = True

    @property
    def num_draft_tokens(self) -> int:
        return self.model.spec.num_draft_tokens

    @property
    def has_confidence(self) -> bool:
        return self.use_heads and self.model.confidence_head is not None

    def _blocks(
        self,
        ids: torch.Tensor,
        features: torch.Tensor,
        anchors: torch.Tensor,
        *,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> DraftBlocks:
        import torch

        with torch.no_grad():
            base, hidden = run_blocks(self.model, ids, features, anchors)
            blocks = sample_slots(
                base_logits=base,
                hidden=hidden,
                first_prev=ids[anchors],
                model=self.model,
                use_heads=self.use_heads,
                temperature=temperature,
                generator=generator,
            )
        blocks.anchors = anchors
        return blocks

    def draft(self, sample: TrainingSample, anchors: torch.Tensor) -> DraftBlocks:
        return self._blocks(sample.input_ids, sample.hidden_states, anchors)
