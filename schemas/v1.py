"""Schema v1 of a training-target sample: one row per regenerated assistant turn.

This file is the contract between the regeneration stage (writer), the trainer
(reader) and any downstream repository that reads the shards with plain
pyarrow, DuckDB or Hugging Face `datasets`. It is frozen: a change is a new
module `v2.py`, never an edit here (tests/shards/test_schema.py pins the field
list), and readers keep accepting v1.

Why the tensors are `large_binary` and not Arrow tensor types: every tensor is
a self-describing codec frame (pipeline/shards/codecs.py). Measured on the
synthetic stream (bench/RESULTS.md), Parquet's own element-wise encodings of a
`list<uint16>` / `fixed_size_binary(2)` column write at 30-80 MB/s, far below
the 200 MB/s a writer needs, while one frame per tensor stored as a single
binary value writes at disk speed; and `datasets` cannot read Arrow's
`fixed_shape_tensor` extension type at all (docs/design.md#storage-and-commit).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

VERSION = 1


@dataclass(frozen=True)
class FieldSpec:
    """One column: name, Arrow type, nullability and what it means."""

    name: str
    type: pa.DataType
    description: str
    nullable: bool = False


FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec(
        "sample_id",
        pa.string(),
        "Content hash of the normalised source conversation plus the index of the "
        "regenerated assistant turn; unique within a dataset version.",
    ),
    FieldSpec("source", pa.string(), "Name of the corpus the conversation came from."),
    FieldSpec("domain", pa.string(), "Domain tag: math, code, chat, translation, ..."),
    FieldSpec(
        "input_ids",
        pa.list_(pa.int32()),
        "Token ids of the rendered prompt followed by the regenerated answer; length T.",
    ),
    FieldSpec(
        "loss_mask",
        pa.list_(pa.uint8()),
        "Length T; 1 on tokens the draft learns (assistant tokens incl. end of turn), else 0.",
    ),
    FieldSpec(
        "hidden_states",
        pa.large_binary(),
        "Codec frame of a [T, k*H] tensor: the residual streams at the k captured aux "
        "layer ids (aux id j = stream after j decoder layers), concatenated along the "
        "last axis in the order of the provenance's aux_layer_ids.",
    ),
    FieldSpec(
        "last_hidden_state",
        pa.large_binary(),
        "Codec frame of a [T, H] tensor: the final hidden state after the target's "
        "final norm, so target logits are rebuilt exactly with the frozen lm_head.",
    ),
    FieldSpec(
        "finish_reason",
        pa.string(),
        "Why generation stopped: 'stop' (end of turn / stop token) or 'length' (max tokens).",
    ),
    FieldSpec(
        "num_prompt_tokens",
        pa.int32(),
        "Tokens of the rendered prompt (conversation before the regenerated turn).",
    ),
    FieldSpec(
        "num_generated_tokens",
        pa.int32(),
        "Tokens the target generated; num_prompt_tokens + num_generated_tokens == T.",
    ),
)

# Columns small enough to read for filtering and lookups without touching tensors.
SMALL_COLUMNS: tuple[str, ...] = ("sample_id", "source", "domain", "finish_reason")
TENSOR_COLUMNS: tuple[str, ...] = ("hidden_states", "last_hidden_state")

SCHEMA = pa.schema([pa.field(f.name, f.type, nullable=f.nullable) for f in FIELDS])
