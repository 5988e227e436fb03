"""Near-duplicate conversations across sources: MinHash signatures in an LSH index.

Exact duplicates (equal normalised content) are dropped by their hash in
ingest.py; this catches the same prompt reworded a little or copied from one
public set into another (a question with different whitespace, casing or
punctuation, a greeting with one word changed), which would otherwise count
twice in training and, worse, leak a left-out source's prompts into training.

A conversation's fingerprint is the text of its user turns, lower-cased with
punctuation and runs of whitespace folded, as word 3-grams (short texts: their
words). Two conversations whose estimated Jaccard similarity reaches
`threshold` are near-duplicates; the first one offered to the index wins, so
the outcome depends only on the order of the offers (ingest.py offers sources
in config order, each in its selection order).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pydantic import Field

from pipeline.config import ConfigModel

_WORD = re.compile(r"\w+", re.UNICODE)


class NearDuplicateConfig(ConfigModel):
    """Near-duplicate removal (`corpus.near_duplicates`)."""

    # Estimated Jaccard similarity of word 3-grams at which two conversations are one.
    threshold: float = Field(0.7, gt=0.0, le=1.0)
    # MinHash permutations: more is a finer estimate and a slower index.
    num_perm: int = Field(128, ge=16)
    seed: int = 1


def shingles(texts: Sequence[str], n: int = 3) -> set[bytes]:
    """Word n-grams of the texts (lower-cased, punctuation dropped); the words of short ones."""
    words = [w for t in texts for w in _WORD.findall(t.lower())]
    if len(words) < n:
        return {" ".join(words).encode()} if words else set()
    return {" ".join(words[i : i + n]).encode() for i in range(len(words) - n + 1)}


class NearDuplicateIndex:
    """Offer conversations one at a time; `offer` says whether one is new."""

    def __init__(self, config: NearDuplicateConfig) -> None:
        from datasketch import MinHashLSH

        self.config = config
        self._lsh = MinHashLSH(threshold=config.threshold, num_perm=config.num_perm)
        self._order: dict[str, int] = {}

    def offer(self, key: str, texts: Sequence[str]) -> str | None:
        """None if the texts are new (now indexed under `key`), else the key of the earliest
        indexed conversation they nearly duplicate."""
        from datasketch import MinHash

        grams = shingles(texts)
        if not grams:
            return None  # nothing to compare: exact dedup is all that applies
        signature = MinHash(num_perm=self.config.num_perm, seed=self.config.seed)
        signature.update_batch(list(grams))
        found = self._lsh.query(signature)
        if found:
            return min(found, key=self._order.__getitem__)
        self._lsh.insert(key, signature)
        self._order[key] = len(self._order)
        return None
