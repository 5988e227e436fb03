"""`DraftSpec`: the resolved draft architecture, the record every checkpoint keeps.

A DraftConfig (what the user asked for) resolved against the target (its
shapes) and the dataset (its aux layers): `DraftConfig.resolve` in
pipeline/train/config.py builds one. Plain data, no torch, so configs,
checkpoints and exports can read and write it cheaply.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class DraftSpec:
    """The resolved draft architecture: target shapes + DraftConfig choices."""

    kind: str  # a kind of pipeline/drafts/registry.py: dspark, dflash, eagle3
    vocab_size: int  # target vocabulary (embedding rows)
    hidden_size: int  # d == target hidden size (embeddings and lm_head are shared)
    target_hidden_size: int  # H of the captured target layers
    aux_layer_ids: tuple[int, ...]  # vLLM convention: stream after k decoder layers
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    block_size: int
    mask_token_id: int
    sample_from_anchor: bool
    markov_rank: int  # 0: no Markov head (dflash)
    confidence_head: bool
    confidence_with_markov: bool
    # The target's RoPE scaling beyond theta (rope_type and its parameters, e.g.
    # {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
    # copied so the draft's positions rotate as the target's do; None: plain RoPE.
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    # Target embeddings are multiplied by this (Gemma: sqrt(hidden_size)).
    embed_scale: float = 1.0
    # Target logits are capped as c * tanh(logits / c) (Gemma's final_logit_softcapping).
    logit_softcap: float | None = None
    # The target ids the draft's head proposes, sorted (pipeline/drafts/vocab.py: a
    # reduced draft vocabulary, exported as d2t/t2d); None: the whole vocabulary.
    draft_vocab: tuple[int, ...] | None = None

    @property
    def draft_vocab_size(self) -> int:
        """Rows of the draft's head: the reduced vocabulary's size, else the target's."""
        return self.vocab_size if self.draft_vocab is None else len(self.draft_vocab)

    @property
    def first_offset(self) -> int:
        """Offset from the anchor of the token slot 0 predicts (0: slot 0 predicts nothing)."""
        return 1 if self.sample_from_anchor else 0

    @property
    def num_draft_tokens(self) -> int:
        """Tokens drafted per block (vLLM's num_speculative_tokens)."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    def to_json(self) -> str:
        data = {**asdict(self), "aux_layer_ids": list(self.aux_layer_ids)}
        del data["draft_vocab"]  # full-vocabulary specs keep the layout they always had
        text = json.dumps(data, indent=2)
        if self.draft_vocab is None:
            return text
        # Thousands of ids: one line, not one line each.
        return text[: -len("\n}")] + f',\n  "draft_vocab": {json.dumps(list(self.draft_vocab))}\n}}'

    @classmethod
    def from_json(cls, text: str) -> DraftSpec:
        """Specs written before a field existed load with its default (plain RoPE,
        no embedding scale, no soft-capping: what those drafts were trained with)."""
        data = json.loads(text)
        vocab = data.get("draft_vocab")
        return cls(
            **{
                **data,
                "aux_layer_ids": tuple(data["aux_layer_ids"]),
                "draft_vocab": None if vocab is None else tuple(vocab),
            }
        )
