"""What a sample is called: a conversation's content hash, its samples' ids, and the hashes keyed on them.

Every stage keys on these names: ingestion names a conversation by its
content, regeneration plans and requests by sample id, the shards' sample
index and partition keys are hashes of the id, and the held-out split and the
trainer's per-sample draws are hashes of it too. They are stored in committed
datasets, so a change to any function here renames data that already exists:
tests/corpus/test_identity.py pins their values.

* `conversation_hash(messages)`: sha256 of the normalised messages as
  canonical JSON; equal content, equal id.
* `sample_id(conversation, turn)`: the row of answer `turn` of a conversation,
  `<first 32 hex digits of the hash>-<turn, 3 digits>`.
* `conversation_of(sample_id)`: the id without its turn, the part every turn
  of a conversation shares.
* `partition_key(sample_id)`: a 64-bit hash of that part, uniform over
  `KEY_BITS` bits, so every turn of a conversation lands in the same bucket.
* `input_hash(sample_id, domain, source)`: what a sample was made from besides
  its id (domain and source are stored in every row).
* `hash64(text)` / `unit_interval(text)`: the first 64 bits of a text's sha256,
  as an integer or as a fraction in [0, 1): stable draws keyed on an id.

It sits in `corpus/`, the lowest package that knows what a conversation is, so
`shards/`, `regenerate/`, `train/` and `evaluate/` all import it from below.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

# Width of a partition key; a bucket is a range of this space (`shards.sidecar.bucket_of`).
KEY_BITS = 64


def conversation_hash(messages: Sequence[dict[str, Any]]) -> str:
    """Content hash of a normalised conversation (canonical JSON, sha256, 64 hex digits)."""
    payload = json.dumps(list(messages), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def sample_id(conversation: str, turn: int) -> str:
    """Id of the row for answer `turn` (0-based) of the conversation whose hash is
    `conversation`: stable across runs and machines."""
    return f"{conversation[:32]}-{turn:03d}"


def conversation_of(sample_id: str) -> str:
    """The conversation part of a sample id (its `-<turn>` cut off; an id without one is
    its own conversation)."""
    return sample_id.rsplit("-", 1)[0] if "-" in sample_id else sample_id


def hash64(text: str) -> int:
    """The first 64 bits of `text`'s sha256, big-endian: a stable, uniform integer."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def unit_interval(text: str) -> float:
    """`hash64(text)` as a fraction in [0, 1): a stable draw keyed on `text` (an id, or an id
    with a salt, so that two draws on one id are independent)."""
    return hash64(text) / 2**KEY_BITS


def partition_key(sample_id: str) -> int:
    """64-bit key of a sample's conversation: equal for every turn, uniform over the space."""
    return hash64(conversation_of(sample_id))


def input_hash(sample_id: str, domain: str, source: str) -> str:
    """What a sample was made from besides its id (the id hashes the conversation itself)."""
    return hashlib.sha256(f"{sample_id}|{domain}|{source}".encode()).hexdigest()[:16]
