"""A version's totals (rows, tokens, bytes, per domain and source), counted as a delta."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pipeline.table.manifest import Manifest, ShardEntry, Totals

if TYPE_CHECKING:
    from pipeline.table.manifest import DatasetLike


class Counts:
    def __init__(self, t: Totals) -> None:
        self.shards, self.rows, self.tokens, self.bytes = t.shards, t.rows, t.tokens, t.bytes
        self.stored_rows = t.stored_rows
        self.by_domain, self.by_source = Counter(t.by_domain), Counter(t.by_source)

    @classmethod
    def of(cls, t: Totals) -> Counts:
        return cls(t)

    def add_rows(self, rows, sign: int) -> None:
        for r in rows:
            self.rows += sign
            self.tokens += sign * r.tokens
            self.by_domain[r.domain] += sign
            self.by_source[r.source] += sign

    def totals(self) -> Totals:
        return Totals(
            shards=self.shards,
            rows=self.rows,
            tokens=self.tokens,
            bytes=self.bytes,
            stored_rows=self.stored_rows,
            by_domain={k: v for k, v in self.by_domain.items() if v},
            by_source={k: v for k, v in self.by_source.items() if v},
        )


def parent_totals(
    ds: DatasetLike, parent: Manifest | None, base: Mapping[str, ShardEntry]
) -> Totals:
    if parent is None:
        return Totals()
    assert parent.totals is not None, "a committed version has its totals"
    return parent.totals
