"""Deterministic work units, planned over the samples a dataset version does not hold yet.

**Buckets.** A conversation's bucket is its partition key (a hash of its
content, `corpus.identity.partition_key`, equal for all its turns) cut into
the lineage's fixed bucket space (`num_buckets`, chosen once when the
lineage starts and stored in its manifest), so it never depends on the
corpus size: adding conversations changes no committed unit.

**Units.** Planning starts from a diff (`diff_corpus`) between the corpus
snapshot and the live members of the dataset's latest version, by sample id
and input hash. A unit is (bucket, the bucket's conversations still to do),
cut into chunks of at most `conversations_per_unit`. A rerun on the same
corpus has nothing to do; a grown corpus adds units of new conversations
only; a run that crashed halfway plans only what no version holds.

**Unit ids** join the bucket with a digest of everything that determines the
unit's output (the member conversations with their domain and source, and
the run fingerprint: target revision, tokenizer, layers, generation
parameters, codec, ...). They name the shard file (plus an attempt token,
`shards/writer.py`); exactly-once is enforced by the commit per sample id,
not by unit names.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.corpus.identity import input_hash, partition_key, sample_id
from pipeline.corpus.records import Conversation
from pipeline.regenerate.units import WorkUnit
from pipeline.shards.sidecar import bucket_of


def run_fingerprint(fields: dict[str, Any]) -> str:
    """Digest of the settings that determine a unit's output (JSON-canonical)."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def num_buckets_for(num_conversations: int, conversations_per_unit: int) -> int:
    """A new lineage's bucket space: one bucket per unit of the corpus it starts with."""
    return max(1, math.ceil(num_conversations / conversations_per_unit))


def conversation_key(conv: Conversation) -> int:
    """The partition key of a conversation (that of its sample ids)."""
    return partition_key(sample_id(conv.conversation_id, 0))


def planned_sample_ids(conv: Conversation, turns: str) -> list[str]:
    """Sample ids a conversation yields under `turns` ("all" or "last")."""
    from pipeline.render import answer_turns

    return [sample_id(conv.conversation_id, t) for t in answer_turns(conv.messages, turns)]


def sample_inputs(conv: Conversation, turns: str) -> dict[str, str]:
    """sample id -> input hash, for every sample the conversation yields."""
    return {
        sid: input_hash(sid, conv.domain, conv.source) for sid in planned_sample_ids(conv, turns)
    }


def unit_inputs(unit: WorkUnit, turns: str) -> dict[str, str]:
    """sample id -> input hash of every sample `unit` was planned to hold."""
    planned: dict[str, str] = {}
    for conv in unit.conversations:
        planned.update(sample_inputs(conv, turns))
    return planned


def plan_units(
    conversations: Sequence[Conversation],
    num_buckets: int,
    fingerprint: str,
    *,
    conversations_per_unit: int | None = None,
) -> list[WorkUnit]:
    """Group conversations into units by bucket (chunked); units in bucket order."""
    if num_buckets <= 0:
        raise ValueError(f"num_buckets must be positive, got {num_buckets}")
    if conversations_per_unit is not None and conversations_per_unit <= 0:
        raise ValueError(f"conversations_per_unit must be positive, got {conversations_per_unit}")
    width = max(4, len(str(num_buckets - 1)))
    groups: dict[int, list[tuple[int, Conversation]]] = {}
    for conv in conversations:
        key = conversation_key(conv)
        groups.setdefault(bucket_of(key, num_buckets), []).append((key, conv))
    units = []
    for bucket in sorted(groups):
        members = [
            c for _, c in sorted(groups[bucket], key=lambda kc: (kc[0], kc[1].conversation_id))
        ]
        size = conversations_per_unit or len(members)
        for start in range(0, len(members), size):
            chunk = tuple(members[start : start + size])
            h = hashlib.sha256(fingerprint.encode())
            for conv in chunk:
                # Domain and source are stored in every row, so they are inputs too.
                h.update(f"{conv.conversation_id}|{conv.domain}|{conv.source}\n".encode())
            units.append(WorkUnit(f"u{bucket:0{width}d}-{h.hexdigest()[:12]}", bucket, chunk))
    return units


@dataclass(frozen=True)
class CorpusDiff:
    """A corpus snapshot against the live members of a version, by sample id and input hash."""

    todo: list[Conversation]  # conversations to regenerate (every sample of each)
    new: frozenset[str]  # sample ids the version does not hold
    changed: frozenset[str]  # held with another input hash (domain or source changed)
    removed: frozenset[str]  # held, but no longer in the corpus
    unchanged: int  # samples held as they are
    # sample id -> the shard that holds it now: dropped there when its new row commits.
    replaced: dict[str, str] = field(default_factory=dict)
    # shard path -> sample ids to tombstone (removed from the corpus).
    tombstones: dict[str, set[str]] = field(default_factory=dict)

    @property
    def num_todo_samples(self) -> int:
        return len(self.new) + len(self.changed)

    def line(self) -> str:
        return (
            f"{len(self.new)} new, {len(self.changed)} changed, {len(self.removed)} removed, "
            f"{self.unchanged} unchanged samples"
        )


def diff_corpus(
    conversations: Sequence[Conversation],
    live: Mapping[str, tuple[str, str]],
    turns: str,
    *,
    apply_changes: bool = True,
) -> CorpusDiff:
    """What to regenerate so a version holds exactly the corpus' samples.

    `live`: sample id -> (shard path, input hash) of the version's live members.
    With `apply_changes=False` (plain `regenerate`) only conversations with new
    samples are planned; changed and removed samples are counted, left as they are.
    """
    todo, new, changed, replaced = [], set(), set(), {}
    wanted: set[str] = set()
    unchanged = 0
    for conv in conversations:
        inputs = sample_inputs(conv, turns)
        wanted.update(inputs)
        conv_new = {sid for sid in inputs if sid not in live}
        conv_changed = {sid for sid, h in inputs.items() if sid in live and live[sid][1] != h}
        new |= conv_new
        changed |= conv_changed
        if conv_new or (apply_changes and conv_changed):
            todo.append(conv)
            replaced.update({sid: live[sid][0] for sid in inputs if sid in live})
        else:
            unchanged += len(inputs) - len(conv_changed)
    removed = {sid for sid in live if sid not in wanted}
    tombstones: dict[str, set[str]] = {}
    if apply_changes:
        for sid in removed:
            tombstones.setdefault(live[sid][0], set()).add(sid)
    return CorpusDiff(
        todo=todo,
        new=frozenset(new),
        changed=frozenset(changed),
        removed=frozenset(removed),
        unchanged=unchanged,
        replaced=replaced,
        tombstones=tombstones,
    )
