"""The corpus mixture: how many conversations each source contributes, and which.

With `corpus.size` set, source s contributes round(size * w_s / sum(w)) of its
conversations (largest remainders; a source with fewer gives all it has, and
the shortfall is reported, not filled from the others, so weights mean what
they say). Which ones: a source's conversations in the order of a hash of
(mixture seed, conversation id), the first ones that are not near-duplicates
of an earlier pick. The order does not depend on the file order or on the
other sources, and a larger `size` keeps the earlier picks (but one that a new
pick of an earlier source nearly duplicates): growing a corpus adds
conversations, so a dataset grows without regenerating what it holds.
Without `size` every conversation is kept (but near-duplicates), in read order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.corpus.near_dup import NearDuplicateConfig, NearDuplicateIndex
from pipeline.corpus.records import Conversation


@dataclass
class SourceCount:
    """What one source gave the corpus."""

    available: int = 0  # conversations after exact deduplication
    quota: int | None = None  # what the weights ask of it (None: everything)
    selected: int = 0
    near_duplicates: int = 0  # passed over as near-duplicates of an earlier pick
    weight: float = 1.0
    licence: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if v is not None}


def selection_key(seed: int, conversation_id: str) -> bytes:
    return hashlib.sha256(f"{seed}:{conversation_id}".encode()).digest()


def quotas(size: int, weights: dict[str, float]) -> dict[str, int]:
    """round(size * w / sum(w)) per source, by largest remainder so they sum to `size`."""
    total = sum(weights.values())
    exact = {name: size * w / total for name, w in weights.items()}
    out = {name: int(x) for name, x in exact.items()}
    by_remainder = sorted(exact, key=lambda n: (-(exact[n] - out[n]), n))
    for name in by_remainder[: size - sum(out.values())]:
        out[name] += 1
    return out


def user_texts(conv: Conversation) -> list[str]:
    return [m["content"] for m in conv.messages if m["role"] == "user" and m.get("content")]


def select(
    by_source: dict[str, list[Conversation]],
    weights: dict[str, float],
    *,
    size: int | None,
    seed: int,
    near_duplicates: NearDuplicateConfig | None,
    counts: dict[str, SourceCount],
) -> list[Conversation]:
    """The mixture's conversations, source by source in `by_source`'s order."""
    quota = quotas(size, weights) if size is not None else {}
    index = NearDuplicateIndex(near_duplicates) if near_duplicates is not None else None
    picked: list[Conversation] = []
    for name, convs in by_source.items():
        count = counts[name]
        count.available = len(convs)
        count.quota = quota.get(name)
        want = count.quota if count.quota is not None else len(convs)
        ordered: Sequence[Conversation] = (
            convs
            if size is None
            else sorted(convs, key=lambda c: selection_key(seed, c.conversation_id))
        )
        for conv in ordered:
            if count.selected >= want:
                break
            if index is not None and index.offer(conv.conversation_id, user_texts(conv)):
                count.near_duplicates += 1
                continue
            picked.append(conv)
            count.selected += 1
    return picked
