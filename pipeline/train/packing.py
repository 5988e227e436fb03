"""How decoded samples become a training batch: anchors, packing.

* **Truncation** (pipeline/table/split.py, at decoding): a sample longer than
  `max_seq_len` keeps its first `max_seq_len` tokens (prompt first, then the
  answer's beginning); anchors are drawn on what is kept, so memory per sample
  is bounded whatever the answer.
* **Anchors**: up to `num_anchors` per sequence among loss-mask positions whose
  next token is also a loss-mask token, seeded per (seed, epoch, sample id), so
  the same sample yields different blocks each epoch and any micro-batch split
  draws the same ones.
* **Packing**: samples share a row up to `max_row_tokens` context tokens; the
  attention mask keeps them apart (drafts/block_mask.py: context_mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.corpus.identity import hash64
from pipeline.drafts.inputs import DraftInputs
from pipeline.drafts.spec import DraftSpec
from pipeline.shards.reader import TrainingSample


@dataclass
class TrainBatch:
    inputs: DraftInputs
    last_hidden: torch.Tensor  # (R, Tc, H) target's post-norm final hidden state
    teacher_index: torch.Tensor  # (R, Nb, B) int64: context slot whose logits give the target dist.
    target_ids: torch.Tensor  # (R, Nb, B) int64: token each slot drafts (0 where invalid)
    valid: torch.Tensor  # (R, Nb, B) bool
    num_samples: int
    num_tokens: int

    def to(self, device) -> TrainBatch:
        return TrainBatch(
            self.inputs.to(device),
            self.last_hidden.to(device),
            self.teacher_index.to(device),
            self.target_ids.to(device),
            self.valid.to(device),
            self.num_samples,
            self.num_tokens,
        )

    def teacher_hidden(self) -> torch.Tensor:
        """(R, Nb, B, H) the target's stored post-norm final hidden state whose logits
        (through the frozen lm_head) give the distribution of each slot's token."""
        r, nb, b = self.teacher_index.shape
        idx = self.teacher_index.view(r, nb * b, 1).expand(-1, -1, self.last_hidden.shape[-1])
        return self.last_hidden.gather(1, idx).view(r, nb, b, -1)

    def teacher_logits(self, model) -> torch.Tensor:
        """(R, Nb, B, V) the target's logits for every slot (dense: tests and tiny models;
        the trainer's chunked loss never builds this)."""
        return model.target_logits(self.teacher_hidden())


def derived_seed(*parts: object) -> int:
    """A 63-bit seed from its parts (stable across runs and machines)."""
    return hash64("/".join(str(p) for p in parts)) & ((1 << 63) - 1)


def choose_anchors(
    loss_mask: torch.Tensor, num_anchors: int, generator: torch.Generator
) -> torch.Tensor:
    """Sorted anchor positions a with loss_mask[a] and loss_mask[a+1] (at most num_anchors)."""
    m = loss_mask.bool()
    ok = (m[:-1] & m[1:]).nonzero().squeeze(-1)
    if ok.numel() > num_anchors:
        pick = torch.randperm(ok.numel(), generator=generator)[:num_anchors]
        ok = ok[pick].sort().values
    return ok


def pack(
    samples: list[TrainingSample],
    anchors: list[torch.Tensor],
    *,
    spec: DraftSpec,
    max_row_tokens: int,
) -> TrainBatch:
    """Pack samples (with their anchors) into rows; see TrainBatch for the layout."""
    b, off = spec.block_size, spec.first_offset
    rows: list[list[int]] = []
    used = 0
    for i, s in enumerate(samples):
        t = len(s.input_ids)
        if rows and used + t <= max_row_tokens:
            rows[-1].append(i)
            used += t
        else:
            rows.append([i])
            used = t
    tc = max(sum(len(samples[i].input_ids) for i in row) for row in rows)
    nb = max(1, max(sum(len(anchors[i]) for i in row) for row in rows))
    r = len(rows)
    kh = samples[0].hidden_states.shape[1]
    h = samples[0].last_hidden_state.shape[1]
    feats = torch.zeros(r, tc, kh, dtype=samples[0].hidden_states.dtype)
    last = torch.zeros(r, tc, h, dtype=samples[0].last_hidden_state.dtype)
    ctx_pos = torch.zeros(r, tc, dtype=torch.long)
    ctx_doc = torch.full((r, tc), -1, dtype=torch.long)
    ctx_ids = torch.zeros(r, tc, dtype=torch.long)
    block_ids = torch.full((r, nb, b), spec.mask_token_id, dtype=torch.long)
    block_anchor = torch.zeros(r, nb, dtype=torch.long)
    block_doc = torch.full((r, nb), -1, dtype=torch.long)
    prev_ids = torch.zeros(r, nb, b, dtype=torch.long)
    target_ids = torch.zeros(r, nb, b, dtype=torch.long)
    teacher = torch.zeros(r, nb, b, dtype=torch.long)
    valid = torch.zeros(r, nb, b, dtype=torch.bool)
    slots = torch.arange(b) + off  # (B,) offset of the drafted token from the anchor
    tokens = 0
    for ri, row in enumerate(rows):
        c = n = 0
        for doc, i in enumerate(row):
            s, a = samples[i], anchors[i]
            t = len(s.input_ids)
            tokens += t
            feats[ri, c : c + t] = s.hidden_states
            last[ri, c : c + t] = s.last_hidden_state
            ctx_pos[ri, c : c + t] = torch.arange(t)
            ctx_doc[ri, c : c + t] = doc
            ctx_ids[ri, c : c + t] = s.input_ids
            k = len(a)
            if k:
                pos = a[:, None] + slots[None, :]  # (k, B) position of the drafted token
                ok = (slots[None, :] >= 1) & (pos < t)
                posc = pos.clamp(max=t - 1)
                ok &= s.loss_mask[posc]
                block_ids[ri, n : n + k, 0] = s.input_ids[a]
                block_anchor[ri, n : n + k] = a
                block_doc[ri, n : n + k] = doc
                target_ids[ri, n : n + k] = torch.where(ok, s.input_ids[posc], 0)
                prevc = (pos - 1).clamp(min=0, max=t - 1)
                prev_ids[ri, n : n + k] = s.input_ids[prevc]
                teacher[ri, n : n + k] = c + prevc
                valid[ri, n : n + k] = ok
            c += t
            n += k
    inputs = DraftInputs(
        feats, ctx_pos, ctx_doc, block_ids, block_anchor, block_doc, prev_ids, ctx_ids
    )
    return TrainBatch(inputs, last, teacher, target_ids, valid, len(samples), tokens)


def sample_anchors(
    samples: list[TrainingSample], *, num_anchors: int, seed: int, epoch: int
) -> list[torch.Tensor]:
    out = []
    for s in samples:
        gen = torch.Generator().manual_seed(derived_seed(seed, "anchors", epoch, s.sample_id))
        out.append(choose_anchors(s.loss_mask, num_anchors, gen))
    return out
