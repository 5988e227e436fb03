"""Deterministic work units: which conversations go together into one shard.

A conversation's bucket is a function of its content hash alone, so the same
conversation lands in the same bucket on every run and every machine, and a
unit keeps its members when unrelated conversations are added to the corpus.
A unit's id joins its bucket with a digest of everything that determines its
output (the member conversations and the run fingerprint: target revision,
tokenizer, layers, generation parameters, codec, ...). Equal inputs give an
equal id, so a rerun recognises committed units and skips them; changed inputs
give a new id, so a committed shard is never overwritten with other content.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.corpus.records import Conversation


@dataclass(frozen=True)
class WorkUnit:
    unit_id: str  # "u<bucket>-<digest>": the shard's name
    bucket: int
    conversations: tuple[Conversation, ...]  # sorted by conversation id

    @property
    def num_answers(self) -> int:
        return sum(c.num_answers for c in self.conversations)


def run_fingerprint(fields: dict[str, Any]) -> str:
    """Digest of the settings that determine a unit's output (JSON-canonical)."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def num_buckets_for(num_conversations: int, conversations_per_unit: int) -> int:
    return max(1, math.ceil(num_conversations / conversations_per_unit))


def plan_units(
    conversations: Sequence[Conversation], num_buckets: int, fingerprint: str
) -> list[WorkUnit]:
    """Group conversations into units by content-hash bucket; units in bucket order."""
    if num_buckets <= 0:
        raise ValueError(f"num_buckets must be positive, got {num_buckets}")
    width = max(4, len(str(num_buckets - 1)))
    groups: dict[int, list[Conversation]] = {}
    for conv in conversations:
        groups.setdefault(int(conv.conversation_id[:12], 16) % num_buckets, []).append(conv)
    units = []
    for bucket in sorted(groups):
        members = tuple(sorted(groups[bucket], key=lambda c: c.conversation_id))
        h = hashlib.sha256(fingerprint.encode())
        for conv in members:
            # Domain and source are stored in every row, so they are inputs too.
            h.update(f"{conv.conversation_id}|{conv.domain}|{conv.source}\n".encode())
        units.append(WorkUnit(f"u{bucket:0{width}d}-{h.hexdigest()[:12]}", bucket, members))
    return units
